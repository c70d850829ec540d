"""R1-V's SuperCLEVR counting rule, vendored as a test oracle.

Source: github.com/Deep-Agent/R1-V, src/eval/test_qwen2vl_counting_superclevr.py at commit
9d576c7d5a700119b99158133987fac125f71629 (2025-02-06; unchanged up to the repository's head
bbbbe3dc1ea6a74ce31c118c1722b1ee73e372ba). Licence: the repository has no top-level licence file; src/r1-v/LICENSE
(Apache-2.0) covers the training package, not src/eval. Only the answer regex and the correctness test are taken.
Changed: `extract_number_answer` is verbatim; `r1v_correct` is the script's scoring loop body (the comparison that
counts a row as correct) made a function; the model loading, generation and file writing are removed.
"""

import re


def extract_number_answer(output_str):
    # Try to find the number within <answer> tags, if can not find, return None
    answer_pattern = r'<answer>\s*(\d+)\s*</answer>'
    match = re.search(answer_pattern, output_str)
    
    if match:
        return int(match.group(1))
    return None


def r1v_correct(model_output, ground_truth):
    # `ground_truth` is the test file's int; the script's loop: `correct_number += 1` under this condition
    model_answer = extract_number_answer(model_output)
    return model_answer is not None and model_answer == ground_truth
