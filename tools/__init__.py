"""What runs and checks the workshop, apart from what it teaches: the main job's notebook runner
(``run_notebooks``, ``training_session_notebooks``), notebook hygiene, the disk-space and process
priority checks, and the generated figures of the docs: README's results table (``results_table``) and
BENCHMARKS' distillation runs (``distillation_section``)."""
