"""A run reads another project's file shape directly (`data.preset`, `data.columns`): the trainer's own data path
(`build_state`) gets the same samples as the converted file would give."""

import json

from trainer_helpers import tiny_config, write_reward_module

from vlgrpo.trainer.state import build_state


def test_a_run_reads_an_r1v_file_through_data_preset(tmp_path, tiny_model_dir, shapes_dir):
    rows = [json.loads(line) for line in (shapes_dir / "train.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["answer_type"] == "number"][:6]
    r1v = tmp_path / "r1v.jsonl"  # R1-V's columns: image, problem, solution with the answer in <answer> tags
    r1v.write_text(
        "".join(
            json.dumps(
                {
                    "image": str(shapes_dir / r["image"]),
                    "problem": r["question"],
                    "solution": f"<answer> {r['answer']} </answer>",
                }
            )
            + "\n"
            for r in rows
        )
    )
    spec = write_reward_module(tmp_path)
    cfg = tiny_config(
        tiny_model_dir(),
        shapes_dir,
        tmp_path / "run",
        f"reward.recipe={{'{spec}': 1.0}}",
        f"data.train={r1v}",
        "data.preset=r1v",
        "train.steps=0",
    )
    state = build_state(cfg, progress=False)
    samples = state.data.next(len(rows))
    state.close()
    got = sorted((s.question, s.answer, s.answer_type) for s in samples)
    assert got == sorted((r["question"], r["answer"], "number") for r in rows)
