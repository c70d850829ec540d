"""The policy's inputs and forward passes, shared by the rollout engines and the trainer: `prompt` (prompt token ids
built from the image and video sizes, the placeholder mask), `forward` (M-RoPE positions and forward passes with
cached vision features injected instead of pixels: prefill, whole rows, the log-prob passes over shared prompts),
`packed` (the completion pass without padding) and `text_decoder` (the text decoder's layers run outside the
transformers forward, also by the HF engine's decode step)."""
