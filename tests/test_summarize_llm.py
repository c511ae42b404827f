"""The LLM summariser's safety (ctxwarden.summarize_llm) over a real socket: a scripted
OpenAI-compatible upstream of our own plays the model (tests/llmserver.py); the client, the
request, the schema check, the rejections, the retries and compaction's per-cluster fallback are
the real ones. The real llama.cpp server runs in test_summarize_real_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Clock, morning
from ctxwarden import Engine
from ctxwarden.errors import ConfigError, SummarizeError
from ctxwarden.llm import LLMClient
from ctxwarden.summarize_llm import LLMSummarizer, summary_schema
from llmserver import Recorded, Reply, ScriptedServer
from test_summarize import CHAT, O200K

SRC = Path(__file__).resolve().parents[1] / "src"

#: A summary of CHAT that keeps each fact the extractive summary keeps, citing its id.
KEEPS = {
    "key_entities": ["Atlas", "Redis", "Grafana"],
    "main_events": [
        "[m7] dave grew up in Ghent",
        "[m9] frank: Redis cache listens on port 6380 now",
    ],
    "decisions": ["[m2] alice: release of Atlas moved to Friday March 13"],
    "open_loops": [
        "[m4] carol: who owns the Grafana dashboards for billing?",
        "[m8] erin: what port does the Redis cache use?",
    ],
    "spam_patterns": ["deploybot x3: deploy to staging succeeded"],
}
#: The issue's report: the small model wrote the prompt's template back.
TEMPLATE = {
    "key_entities": ["<people, teams, projects named>"],
    "main_events": ["<what happened, one short sentence each>"],
    "decisions": ["<what was decided or changed>"],
    "open_loops": [],
    "spam_patterns": [],
}


def run(script: Any, *, timeout: float = 10.0, **options: Any):
    with (
        ScriptedServer(script) as server,
        LLMClient(server.url, "sk-test", model="tiny", timeout=timeout, max_retries=0) as client,
    ):
        outcome = LLMSummarizer(client, **options).summarize_detailed(
            CHAT, max_tokens=200, tokenizer=O200K
        )
    return outcome, server


def last_ask(server: ScriptedServer, n: int) -> str:
    return str(server.chat_requests()[n].body["messages"][-1]["content"])


def test_a_summary_that_keeps_the_facts_passes_first_time() -> None:
    outcome, server = run([json.dumps(KEEPS)])
    assert outcome.calls == 1
    assert outcome.rejections == ()
    assert outcome.summary.decisions == tuple(KEEPS["decisions"])
    [request] = server.chat_requests()
    prompt = request.body["messages"][1]["content"]
    # The prompt lists the facts that must stay, and has no placeholder to copy.
    assert "- [m9] Redis cache listens on port 6380 now" in prompt
    assert "<" not in prompt.split("Messages:")[0]


def test_the_template_echoed_back_is_rejected_and_asked_again() -> None:
    outcome, server = run([json.dumps(TEMPLATE), json.dumps(KEEPS)])
    assert outcome.calls == 2
    assert outcome.rejections[0].startswith("echo: ")
    assert "<people, teams, projects named>" in outcome.rejections[0]
    assert "rejected" in last_ask(server, 1)
    assert "<" not in outcome.summary.render()


def test_a_template_every_time_is_an_error_never_stored() -> None:
    with pytest.raises(SummarizeError, match="rejected 3 time") as info:
        run([json.dumps(TEMPLATE)] * 3)
    assert info.value.reason == "echo"


def test_a_field_description_echoed_is_the_template_too() -> None:
    hint = dict(
        KEEPS, main_events=[*KEEPS["main_events"], "what happened, one short sentence each"]
    )
    with pytest.raises(SummarizeError) as info:
        run([json.dumps(hint)], retries=0)
    assert info.value.reason == "echo"


def test_a_summary_that_drops_the_ids_of_its_facts_is_rejected() -> None:
    no_ids = {k: [line.split("] ", 1)[-1] for line in v] for k, v in KEEPS.items()}
    outcome, server = run([json.dumps(no_ids), json.dumps(KEEPS)])
    assert outcome.rejections[0].startswith("dropped_ids: ")
    assert "m2, m4, m7, m8, m9" in outcome.rejections[0]
    assert "does not cite the ids" in last_ask(server, 1)
    with pytest.raises(SummarizeError) as info:
        run([json.dumps(no_ids)], retries=0)
    assert info.value.reason == "dropped_ids"


def test_a_summary_that_loses_a_fact_the_extractive_keeps_is_rejected() -> None:
    vague = dict(KEEPS, main_events=["[m7] dave grew up in Ghent", "[m9] Redis port changed"])
    outcome, server = run([json.dumps(vague), json.dumps(KEEPS)])
    assert outcome.rejections == (
        "lost_facts: it loses 1 fact(s): [m9] Redis cache listens on port 6380 now, changed it "
        "yesterday.",
    )
    assert "6380" in last_ask(server, 1)
    assert "6380" in outcome.summary.render()


def test_bad_json_then_good_is_retried_and_bad_json_always_is_an_error() -> None:
    outcome, _ = run(["Sure! Here is a summary: the team talked.", json.dumps(KEEPS)])
    assert outcome.reasked_invalid
    assert outcome.rejections[0].startswith("invalid: the reply is not JSON")
    with pytest.raises(SummarizeError, match="rejected 2 time") as info:
        run(["{no", "[]"], retries=1)
    assert info.value.reason == "invalid"


def test_the_schema_check_names_the_field() -> None:
    wrong = dict(KEEPS, decisions=[{"what": "x"}])
    with pytest.raises(SummarizeError, match=r"decisions\[0\]: .* is not of type 'string'"):
        run([json.dumps(wrong)], retries=0)


def test_retries_is_the_count_of_re_asks() -> None:
    with pytest.raises(SummarizeError, match="rejected 1 time"):
        run([json.dumps(TEMPLATE), json.dumps(KEEPS)], retries=0)
    with pytest.raises(ConfigError, match=r"summarizer\.retries"):
        LLMSummarizer(object(), retries=-1)


def test_no_answer_in_time_is_a_timeout_error_and_not_asked_again() -> None:
    with pytest.raises(SummarizeError, match="no answer within 0.3s") as info:
        run([Reply(body=json.dumps(KEEPS), delay=2.0)], timeout=0.3)
    assert info.value.reason == "timeout"
    assert "summarizer_timeout" in str(info.value)
    assert "sk-test" not in str(info.value)


def test_a_server_that_keeps_timing_out_is_not_asked_for_every_call() -> None:
    with (
        ScriptedServer(lambda request: Reply(body=json.dumps(KEEPS), delay=1.0)) as server,
        LLMClient(server.url, model="tiny", timeout=0.2, max_retries=0) as client,
    ):
        summarizer = LLMSummarizer(client, give_up_after=2)
        reasons = []
        for _ in range(5):
            with pytest.raises(SummarizeError) as info:
                summarizer.summarize(CHAT, max_tokens=200, tokenizer=O200K)
            reasons.append(info.value.reason)
        asked = len(server.chat_requests())
    assert reasons == ["timeout", "timeout", "unavailable", "unavailable", "unavailable"]
    assert asked == 2


def test_auto_moves_to_the_next_structured_output_the_server_takes() -> None:
    def llama_cpp_python(request: Recorded) -> Reply | str:
        # llama-cpp-python's server: response_format.type is json_object (with a schema) or text
        if request.body.get("response_format", {}).get("type") == "json_schema":
            return Reply(status=422, body={"detail": [{"msg": "Input should be 'json_object'"}]})
        return json.dumps(KEEPS)

    with (
        ScriptedServer(llama_cpp_python) as server,
        LLMClient(server.url, model="tiny", max_retries=0) as client,
    ):
        summarizer = LLMSummarizer(client)
        first = summarizer.summarize_detailed(CHAT, max_tokens=200, tokenizer=O200K)
        second = summarizer.summarize_detailed(CHAT, max_tokens=200, tokenizer=O200K)
    assert first.structured_output == second.structured_output == "json_object_schema"
    formats = [r.body["response_format"] for r in server.chat_requests()]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object"]
    assert formats[1]["schema"] == summary_schema(len(CHAT) + 4)


def test_a_500_naming_response_format_moves_on_too() -> None:
    # what llama-cpp-python's server really answers to OpenAI's json_schema type
    refusal = Reply(
        status=500,
        body={"error": {"message": "1 validation error: ('body', 'response_format', 'type'): "
                        "Input should be 'text' or 'json_object'"}},
    )  # fmt: skip
    outcome, server = run([refusal, json.dumps(KEEPS)])
    assert outcome.structured_output == "json_object_schema"
    assert len(server.chat_requests()) == 2


def test_a_server_error_that_is_not_about_the_format_is_an_upstream_error() -> None:
    with pytest.raises(SummarizeError, match="model crashed") as info:
        run([Reply(status=500, body={"error": {"message": "model crashed"}})])
    assert info.value.reason == "upstream"


# ---------------------------------------------------------------- compaction falls back per cluster

DAY = 86400.0


def _two_days(start: float) -> list[dict[str, Any]]:
    chatter = (
        "that works for everyone on the team I think, nothing more to add from me about the "
        "whole thing, we talked about it long enough in the last meeting anyway and the notes "
        "can wait until later in the week when everyone is back and has some time again"
    )
    lines = [
        chatter,
        chatter.replace("that works", "this works"),
        chatter.replace("anyway", "honestly"),
        "the customer demo is now Thursday 10:00, not Wednesday 15:00",
        "ok thanks, that works for everyone on the team I think, nothing more to add from me "
        "about the whole thing, we talked about it long enough in the last meeting anyway",
        "sounds good to me, nothing else from my side on that topic today, the notes can wait "
        "until later in the week when everyone is back from the offsite and has some time",
        "I will book room Orion for the demo on Thursday",
        "great, talk later then, going to grab some lunch now everyone, the usual place down "
        "the street unless somebody has a better idea about where to go this time around",
        "lunch sounds good, see you all after the break this afternoon, and bring the notes "
        "from the last review if you still have them lying around somewhere on your desk",
    ]
    return [
        {
            "id": f"d{day}-{n}",
            "session": "team",
            "channel": "general",
            "author": ["rosa", "milo"][n % 2],
            "content": line,
            "created_at": start + day * DAY + n * 600,
        }
        for day in range(2)
        for n, line in enumerate(lines)
    ]


def test_compaction_falls_back_to_extractive_per_cluster_and_says_why(
    engine: Engine, clock: Clock
) -> None:
    engine.ingest(_two_days(clock.now - 20 * DAY))
    plan = engine.compact_plan()
    assert len(plan.clusters) == 2
    first, second = plan.clusters

    def model(request: Recorded) -> str:
        prompt = request.body["messages"][1]["content"]
        if "[d0-3]" in prompt:
            return json.dumps(TEMPLATE)  # the first day's cluster: the template, every time
        facts = [line for line in prompt.split("\n") if line.startswith("- [d1-")]
        return json.dumps(
            {"key_entities": ["Orion"], "main_events": [f[2:] for f in facts],
             "decisions": [], "open_loops": [], "spam_patterns": []}
        )  # fmt: skip

    with (
        ScriptedServer(model) as server,
        LLMClient(server.url, model="tiny", max_retries=0) as client,
    ):
        result = engine.compact(plan, summarizer=LLMSummarizer(client, retries=1))
    assert result.summaries == (first.summary_id, second.summary_id)
    [(cluster, reason)] = result.fallbacks
    assert cluster == first.summary_id
    assert reason.startswith("echo: the model's summary was rejected 2 time(s)")
    fallen = engine.get(first.summary_id).content
    assert "<" not in fallen
    assert "Thursday 10:00, not Wednesday 15:00" in fallen
    # The other cluster kept the model's summary, with its facts and ids.
    kept = engine.get(second.summary_id).content
    assert "[d1-3]" in kept
    assert "Thursday 10:00" in kept
    assert "Orion" in kept


# ---------------------------------------------------------------- the CLI: settings, key, timeout


def _cli(db: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxwarden", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # the worktree's source, not the installed package; no config file of the machine's
        env={**os.environ, "PYTHONPATH": str(SRC), "XDG_CONFIG_HOME": str(db.parent), **env},
    )


def _facts_only(request: Recorded) -> str:
    prompt = request.body["messages"][1]["content"]
    facts = [line[2:] for line in prompt.split("\n") if line.startswith("- [d")]
    return json.dumps(
        {"key_entities": [], "main_events": facts, "decisions": [], "open_loops": [],
         "spam_patterns": []}
    )  # fmt: skip


def test_cli_compact_sends_the_key_from_the_environment_and_never_prints_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in _two_days(morning(20))) + "\n")
    assert _cli(db, "ingest", str(log), env={}).returncode == 0
    key = "sk-summariser-secret-4711"
    with ScriptedServer(_facts_only) as server:
        out = _cli(
            db, "--debug", "compact", "--apply", "--json",
            env={"CTXWARDEN_SUMMARIZER": "llm", "CTXWARDEN_SUMMARIZER_URL": server.url,
                 "CTXWARDEN_SUMMARIZER_MODEL": "tiny", "CTXWARDEN_SUMMARIZER_API_KEY": key},
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["summaries"]) == 2
    assert report["fallbacks"] == []
    requests = server.chat_requests()
    assert len(requests) == 2
    assert {r.headers.get("Authorization") for r in requests} == {f"Bearer {key}"}
    assert {r.body["model"] for r in requests} == {"tiny"}
    assert key not in out.stdout + out.stderr


def test_cli_compact_timeout_is_a_setting_and_the_cluster_falls_back(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in _two_days(morning(20))) + "\n")
    assert _cli(db, "ingest", str(log), env={}).returncode == 0
    # every answer takes longer than the timeout set below
    with ScriptedServer(lambda request: Reply(delay=3.0, body=_facts_only(request))) as server:
        settings = {"CTXWARDEN_SUMMARIZER_TIMEOUT": "0.5", "CTXWARDEN_SUMMARIZER_RETRIES": "0"}
        flags = ["compact", "--apply", "--json", "--summarizer", "llm", "--llm-url", server.url]
        unnamed = _cli(db, *flags, env=settings)
        assert unnamed.returncode != 0
        assert "needs a model name: pass --llm-model" in unnamed.stderr
        out = _cli(db, *flags, "--llm-model", "tiny", env=settings)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["summaries"]) == 2  # both clusters compacted, by the extractive summary
    reasons = [reason for _, reason in report["fallbacks"]]
    assert len(reasons) == 2
    assert all(r.startswith("timeout: ") and "no answer within 0.5s" in r for r in reasons)
