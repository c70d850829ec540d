"""The tiny end-to-end demo (`vlgrpo demo`, `make demo`): run (synthesise the shapes task, SFT cold start, GRPO,
evaluate before and after), report (report.md, curves.png, summary.json)."""
