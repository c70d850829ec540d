"""EasyR1's math reward (the Geometry3K recipes' reward and validation score), vendored as a test oracle.

Source: github.com/hiyouga/EasyR1, examples/reward_function/math.py at commit
b637de85b17cc958e407265523e6d65cbc2a73ed ("[reward] upgrade reward func (#558)", 2025-11-16; unchanged up to the
repository's head b44b311b669bf1fd1aa2fc36f2251482ba33cb16). Licence: Apache-2.0 (the file's header, Copyright 2024
Bytedance Ltd. and/or its affiliates). The grader is mathruler 0.1.0 from the package index (the dev extra), as
EasyR1 installs it. Changed: `accuracy_reward` is verbatim; `easyr1_accuracy` is the accuracy part of
`compute_score` (its whitespace clean-up of the response, then `accuracy_reward`); the format reward and the
weighting are removed.
"""

import re

from mathruler.grader import extract_boxed_content, grade_answer


def accuracy_reward(response: str, ground_truth: str) -> float:
    answer = extract_boxed_content(response)
    return 1.0 if grade_answer(answer, ground_truth) else 0.0


def easyr1_accuracy(response: str, ground_truth: str) -> float:
    response = re.sub(r"\s*(<|>|/)\s*", r"\1", response)  # handle qwen2.5vl-32b format
    return accuracy_reward(response, ground_truth)
