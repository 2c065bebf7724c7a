"""bench.serving at a tiny size: the three servers (a session's sample, a local endpoint, transformers serve)
answer the same prompts, and the table has a line for each server at each number in flight. No timing
is asserted: the machine is shared."""

import pytest

from bench import serving
from bench.tables import machine_facts


def test_a_stream_cut_anywhere_gives_the_same_events():
    raw = b'data: {"a": 1}\n\ndata: {"b": "x\\ny"}\n\ndata: [DONE]\n\n'
    whole = list(serving.sse_events([raw]))
    assert whole == [{"a": 1}, {"b": "x\ny"}]
    for cut in range(1, len(raw)):
        assert list(serving.sse_events([raw[:cut], raw[cut:]])) == whole


def test_a_stream_without_its_usage_is_refused():
    with pytest.raises(RuntimeError, match="usage"):
        serving.read_stream(0.0, [{"choices": [{"delta": {"content": "4"}}]}])


def test_a_failed_request_is_counted_and_the_level_goes_on():
    def send(body):
        if body["n"] == 1:
            raise TimeoutError("no answer within 60 s")
        return serving.Served("x", 3, 0.5, 0.1)

    answers, _ = serving.run_level(send, [{"n": 0}, {"n": 1}, {"n": 2}], in_flight=2)
    level = serving.Level("tiny", "endpoint", 2, 4, answers, wall_s=1.0, load=0.0)
    assert level.failed == 1 and answers[1].error == "TimeoutError: no answer within 60 s"
    assert level.tokens == 6 and level.latency(99) == 0.5


def test_the_block_for_the_docs_names_the_machine_it_was_measured_on():
    answers = [serving.Served("x", 3, 0.5, 0.1)]
    levels = [serving.Level("tiny", server, 1, 4, answers, wall_s=1.0, load=0.5) for server in serving.SERVERS]
    block = serving.report(levels, "python -m bench.serving --models tiny")
    assert f"Machine: {machine_facts()['model']}" in block and "CPU flags" in block
    assert "1 torch thread;" in block  # each server's
    assert block.count("| tiny |") == len(serving.SERVERS)


def test_the_table_is_written_between_its_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n{serving.BEGIN}\nold\n{serving.END}\nafter\n")
    serving.write_between_markers(page, "new\n")
    assert page.read_text() == f"before\n{serving.BEGIN}\nnew\n{serving.END}\nafter\n"
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="no <!-- serving:begin -->"):
        serving.write_between_markers(page, "new\n")


def test_fewer_prompts_than_requests_in_flight_are_refused(tiny_model_path):
    with pytest.raises(ValueError, match="2 prompts cannot keep 4 requests in flight"):
        serving.measure_levels(["tiny"], prompt_count=2, in_flight=(1, 4))


def test_every_server_at_every_number_in_flight(monkeypatch, tiny_model_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    levels = serving.measure_levels(["tiny"], prompt_count=2, max_tokens=4, in_flight=(1, 2), log=lambda *_: None)

    assert [(level.server, level.in_flight) for level in levels] == [
        (server, count) for count in (1, 2) for server in serving.SERVERS
    ]
    for level in levels:
        assert len(level.answers) == 2 and level.failed == 0 and level.tokens_per_s > 0
        assert all(0 < a.tokens <= 4 and 0 < a.first_token <= a.latency for a in level.answers)
        assert 0 < level.latency(50) <= level.latency(99)
    # One request at a time, greedy: the session's and the endpoint's answers are transformers serve's.
    assert [level.same_answers for level in levels if level.in_flight == 1] == [2, 2, 2]

    table = serving.serving_table(levels).splitlines()
    assert table[0].startswith("| model | server | in flight | requests | failed | output tokens | tokens/s |")
    assert len(table) == 2 + len(levels) and len({line.count("|") for line in table}) == 1

    rows = serving.rows(levels)  # the combined table's: session and endpoint against transformers serve
    assert [row.case.split(", ")[1:3] for row in rows] == [
        [server, f"{count} in flight"] for count in (1, 2) for server in ("session", "endpoint")
    ]
    assert all(row.baseline_name == "transformers serve" and row.ours > 0 and row.baseline > 0 for row in rows)
    assert all(row.ratio == pytest.approx(row.ours / row.baseline) for row in rows)
