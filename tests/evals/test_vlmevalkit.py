"""POPE predictions in VLMEvalKit's file shape, scored by VLMEvalKit's own code.

VLMEvalKit comes from the package registry as `ms-vlmeval` (ModelScope's packaging of open-compass/VLMEvalKit),
installed without its dependencies into a temporary folder: its evaluation code needs only pandas (ours) plus
`validators` and `sty`. Its package and dataset `__init__`s import every model and benchmark, so the script
registers those packages as plain namespaces and imports `vlmeval.dataset.image_yorn` itself. Then
`ImageYORNDataset.evaluate` runs unchanged (exact matching, no judge model) on our `pope_vlmevalkit.tsv`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from vlgrpo.evals.run import EvalData, evaluate, write_outputs
from vlgrpo.rewards import RewardContext
from vlgrpo.types import Completion, RolloutGroup, Sample

VLMEVALKIT = ("ms-vlmeval==0.0.20", "validators==0.36.0", "sty==1.0.6")
SCORE = textwrap.dedent("""
    import sys, types
    from types import SimpleNamespace
    root, tsv = sys.argv[1], sys.argv[2]
    sys.path.insert(0, root)
    for name in ("vlmeval", "vlmeval.dataset", "vlmeval.dataset.utils"):  # skip their import-everything __init__s
        module = types.ModuleType(name)
        module.__path__ = [root + "/" + name.replace(".", "/")]
        sys.modules[name] = module
    sys.modules["vlmeval.dataset.utils"].DEBUG_MESSAGE = ""  # used by the judge-model path only
    sys.modules["vlmeval.dataset.utils"].build_judge = None
    from vlmeval.dataset.image_yorn import ImageYORNDataset
    score = ImageYORNDataset.evaluate(SimpleNamespace(dataset_name="POPE"), tsv)  # exact matching
    print(score.to_json(orient="records"))
""")
ANSWERS = [  # (split, gold, completion): tags, hedges, punctuation, case, a long answer
    ("random", "yes", "<think>I see one.</think><answer>Yes</answer>"),
    ("random", "no", "Yes, there is a dog."),
    ("random", "yes", "yes and no"),
    ("random", "no", "No."),
    ("random", "yes", "NO"),
    ("popular", "yes", "Yes."),
    ("popular", "no", "<answer>No, there is not.</answer>"),
    ("popular", "yes", "Maybe"),
    ("popular", "no", "no"),
    ("adversarial", "yes", "Yes"),
    ("adversarial", "no", "Yes!"),
    ("adversarial", "no", "There is no cat; yes, I am sure"),
    ("adversarial", "yes", "(yes)"),
]


class _Scripted:
    def __init__(self, answers):
        self.answers = answers

    def generate(self, samples, params):
        return [RolloutGroup(s, [], [Completion([], self.answers[s.id], "stop")]) for s in samples]


@pytest.fixture(scope="module")
def vlmevalkit(tmp_path_factory):
    target = tmp_path_factory.mktemp("vlmevalkit")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *VLMEVALKIT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, f"could not install VLMEvalKit from the package registry: {pip.stderr[-2000:]}"
    return target


def test_vlmevalkit_scores_our_pope_file_as_our_vlmevalkit_parser_does(vlmevalkit, tmp_path):
    samples = [
        Sample(
            f"q{i}",
            f"Is there a thing {i}?",
            gold,
            "yesno",
            task=f"pope/{split}",
            meta={"split": split, "question_id": i},
        )
        for i, (split, gold, _) in enumerate(ANSWERS)
    ]
    engine = _Scripted({f"q{i}": text for i, (_, _, text) in enumerate(ANSWERS)})
    result = evaluate(engine, EvalData(pope=samples), RewardContext(), pope_parser="vlmevalkit", progress=False)
    paths = write_outputs(result, tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", SCORE, str(vlmevalkit), str(paths["vlmevalkit"])],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PRED_FORMAT": "tsv", "PATH": ""},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = {row["split"]: row for row in json.loads(run.stdout.strip().splitlines()[-1])}
    assert set(theirs) == {"Overall", "random", "popular", "adversarial"}
    m = result.metrics
    for split in ("random", "popular", "adversarial"):
        ours = {k: m[f"eval/pope/{split}/{k}"] * 100 for k in ("f1", "accuracy", "precision", "recall")}
        assert theirs[split]["Overall"] == pytest.approx(ours["f1"])  # their F1 column is called "Overall"
        assert theirs[split]["acc"] == pytest.approx(ours["accuracy"])
        assert theirs[split]["precision"] == pytest.approx(ours["precision"])
        assert theirs[split]["recall"] == pytest.approx(ours["recall"])
    assert m["eval/pope/random/accuracy"] == pytest.approx(2 / 5)  # yes, ~no~, hedge, no, ~NO~: 2 of 5 by hand
