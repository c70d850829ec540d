"""POPE, the hallucination probe: build (probes from a dataset's objects, as the POPE builder does), score (the
published parsers and metrics per split), suite (the registered `pope` eval suite)."""
