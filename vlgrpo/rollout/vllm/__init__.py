"""The vLLM rollout engine: engine (VLLMEngine, the project's only `vllm` import, lazily inside `launch`), inputs (a
request's prompt ids, images, video and limits), sampling (a request's sampling arguments and seed, its output as
Completions), weights (what a weight reload receives). Only `engine` knows vLLM; the others are plain Python."""
