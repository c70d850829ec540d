"""The reasoning benchmarks (MathVista, Geometry3K, SuperCLEVR, MMMU, V* Bench): files (reading a published file as it
is, telling its benchmark, checking its pinned sha256), loaders (one published row to a Sample), score (the published
scoring rules), suite (the registered suites)."""
