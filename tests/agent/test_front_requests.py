"""The UE front's inputs: one validated open request (issue 12 fault 8), session tokens, the
operator credential, ``origin`` among peer fronts only, the body cap (issue 16), and a fuzz of the
open request with a small fixed budget (benchmarks/fuzz.py runs it long).

Field cases: every file of ``../shared/cases/front/`` (read at test time). Their family: open
requests the front accepted and then broke on (a type the engine task chokes on, a token id
beyond the vocabulary, a session id its own routes cannot reach); each must be refused at open
with 400 naming the field, other sessions unaffected.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from pallas_eval.client import UESession
from agent.frontend import (MAX_BODY_BYTES, SESSION_LABEL_RULE, OpenRequest, RequestError, SessionFront,
                            new_session_credentials, token_matches)
from agent.session import SessionStore

import fakes_agent as fk
from fuzz_inputs import front_bodies

CASES = Path(__file__).resolve().parents[2].parent / "shared" / "cases" / "front"
VOCAB = 2048
PROMPT = [5, 9, 11, 300, 2]


_NO_RELAY = httpx.AsyncClient()  # for fronts that only parse (building a client costs ~0.3 s)


def front(**kw) -> SessionFront:
    kw.setdefault("vocab_size", VOCAB)
    return SessionFront(SessionStore(), fk.FakeVllmClient(0.005), agent_id=kw.pop("agent_id", "a"),
                        resume_wait_s=0.5, **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------- field cases
# file -> (the field the 400 names, words its message must carry)
CASE_EXPECT = {
    "max-tokens-as-string.json": ("max_tokens", ["max_tokens", "integer"]),
    "prompt-id-out-of-vocab.json": ("prompt_token_ids", ["prompt_token_ids", "5279552648203111001",
                                                         f"vocab_size {VOCAB}"]),
    "session-id-with-slash.json": ("session_id", ["session_id", SESSION_LABEL_RULE]),
}


def test_every_front_case_has_an_expectation():
    assert sorted(p.name for p in CASES.glob("*.json")) == sorted(CASE_EXPECT)


@pytest.mark.parametrize("name", sorted(CASE_EXPECT))
def test_field_case_is_refused_at_open_naming_the_field_and_others_run_on(name):
    param, words = CASE_EXPECT[name]
    f = front()

    async def go():
        async with fk.ServedApp(f.app) as srv, httpx.AsyncClient() as c:
            other = UESession(srv.url, ue_id="other")
            await other.open(prompt_token_ids=PROMPT, max_tokens=40)
            bad = await c.post(f"{srv.url}/v1/sessions", content=(CASES / name).read_bytes(),
                               headers={"content-type": "application/json"})
            after = await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": PROMPT, "max_tokens": 4,
                                                                 "stream": False})
            toks = await other.run()
            await other.close()
            return bad, after, toks

    bad, after, toks = run(go())
    assert bad.status_code == 400, bad.text
    err = bad.json()["error"]
    assert err["param"] == param
    for w in words:
        assert w in err["message"], err
    assert len(f.store) == 2  # the refused request left nothing behind
    assert after.status_code == 200 and toks == [fk.expected_token(PROMPT, i) for i in range(40)]


# ---------------------------------------------------------------------------- the request model
_PARSERS: dict[tuple, SessionFront] = {}


def parser(**kw) -> SessionFront:
    """A front used only to parse (built once per settings: building the app takes ~20 ms)."""
    key = tuple(sorted(kw.items()))
    if key not in _PARSERS:
        _PARSERS[key] = front(http=_NO_RELAY, **kw)
    return _PARSERS[key]


def parse(body, **kw) -> OpenRequest:
    f = parser(**kw)
    return f.parse_open(json.dumps(body).encode() if not isinstance(body, bytes) else body)


@pytest.mark.parametrize("body, param, fragment", [
    ({"prompt_token_ids": [1], "max_tokens": 8.0}, "max_tokens", "integer"),
    ({"prompt_token_ids": [1], "max_tokens": True}, "max_tokens", "integer"),
    ({"prompt_token_ids": [1], "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"prompt_token_ids": [1], "max_tokens": 2**70}, "max_tokens", "less than or equal"),
    ({"prompt_token_ids": [1], "min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
    ({"prompt_token_ids": [1], "max_tokens": 4, "min_tokens": 5}, "min_tokens", "<= max_tokens"),
    ({"prompt_token_ids": [1], "temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"prompt_token_ids": [1], "temperature": "0"}, "temperature", "number"),
    ({"prompt_token_ids": [1], "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt_token_ids": [1], "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"prompt_token_ids": [1], "top_k": -2}, "top_k", "greater than or equal to -1"),
    ({"prompt_token_ids": [1], "seed": 2**63}, "seed", "less than or equal"),
    ({"prompt_token_ids": [1], "ignore_eos": "yes"}, "ignore_eos", "boolean"),
    ({"prompt_token_ids": [1], "stream": 1}, "stream", "boolean"),
    ({"prompt_token_ids": [1], "scheme": "warp"}, "scheme", "warp"),
    ({"prompt_token_ids": [1], "stop_token_ids": [VOCAB]}, "stop_token_ids", f"vocab_size {VOCAB}"),
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids", "greater than or equal to 0"),
    ({"prompt_token_ids": [1, "2"]}, "prompt_token_ids", "integer"),
    ({"prompt_token_ids": []}, "prompt_token_ids", "at least 1"),
    ({"prompt": [1, VOCAB]}, "prompt", f"vocab_size {VOCAB}"),
    ({"prompt_token_ids": [1], "prompt": [1]}, "prompt_token_ids", "exactly one"),
    ({}, "prompt_token_ids", "exactly one"),
    ({"prompt_token_ids": [1], "max_token": 5}, "max_token", "unknown field"),
    ({"prompt_token_ids": [1], "session_id": "a" * 65}, "session_id", SESSION_LABEL_RULE),
    ({"prompt_token_ids": [1], "ue_id": 7}, "ue_id", "string"),
    ({"prompt_token_ids": [1], "ue_id": "u" * 129}, "ue_id", "at most 128"),
    ({"prompt_token_ids": [1], "stop_token_ids": [1] * 1025}, "stop_token_ids", "at most 1024"),
])
def test_bad_field_is_refused_naming_it(body, param, fragment):
    with pytest.raises(RequestError) as e:
        parse(body)
    assert e.value.param == param and fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("raw, fragment", [
    (b'{"prompt_token_ids": [1], "temperature": NaN}', "finite"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nesting deeper than the JSON parser recurses
    (b'"text"', "JSON object"),
    (b"\xff\xfe", "not JSON"),
])
def test_bad_body_is_refused(raw, fragment):
    with pytest.raises(RequestError, match=fragment):
        parse(raw)


def test_context_length_is_checked_as_vllm_does():
    with pytest.raises(RequestError, match="maximum context length is 64") as e:
        parse({"prompt_token_ids": list(range(10)), "max_tokens": 55}, max_model_len=64)
    assert e.value.param == "max_tokens"
    assert parse({"prompt_token_ids": list(range(10)), "max_tokens": 54}, max_model_len=64).max_tokens == 54


def test_text_prompt_is_tokenized_then_held_to_the_same_rules():
    class Tok:
        def encode(self, text):
            return [int(w) for w in text.split()]

    f = front(tokenizer=Tok(), http=_NO_RELAY)
    assert f.parse_open(b'{"prompt": "5 9 11"}').token_ids == [5, 9, 11]
    with pytest.raises(RequestError, match=f"out of vocabulary \\(vocab_size {VOCAB}\\)") as e:
        f.parse_open(json.dumps({"prompt": f"5 {VOCAB + 3}"}).encode())
    assert e.value.param == "prompt"


def test_valid_request_keeps_its_values():
    req = parse({"prompt_token_ids": [0, VOCAB - 1], "max_tokens": 9, "min_tokens": 9, "temperature": 1,
                 "top_p": 0.5, "top_k": 0, "seed": -(2**63), "stop_token_ids": [3], "ignore_eos": True,
                 "scheme": "ctho", "stream": False, "session_id": "s" * 64, "ue_id": "u" * 128})
    sp = req.sampling()
    assert req.token_ids == [0, VOCAB - 1] and req.scheme == "ctho" and not req.stream
    assert (sp.max_tokens, sp.min_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed, sp.stop_token_ids,
            sp.ignore_eos) == (9, 9, 1.0, 0.5, 0, -(2**63), [3], True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(front_bodies())
def test_fuzzed_open_bodies_are_accepted_valid_or_refused_with_a_field(body):
    """Any JSON body: a RequestError naming a known field (or the body), or a request whose
    every value obeys the rules; never another exception."""
    f = parser(max_model_len=4096)
    try:
        req = f.parse_open(json.dumps(body).encode())
    except RequestError as e:
        assert str(e)
        assert e.param is None or isinstance(e.param, str)
        return
    ids = req.token_ids
    assert ids and all(type(t) is int and 0 <= t < VOCAB for t in ids)
    assert 1 <= req.max_tokens and 0 <= req.min_tokens <= req.max_tokens
    assert len(ids) + req.max_tokens <= 4096
    assert 0 <= req.temperature <= 2 and 0 < req.top_p <= 1 and req.top_k >= -1
    assert isinstance(req.stream, bool) and isinstance(req.ignore_eos, bool)


# ---------------------------------------------------------------------------- tokens
def test_token_is_random_and_bound_to_its_session_id():
    sid, tok = new_session_credentials()
    sid2, tok2 = new_session_credentials("ue-1")
    assert len(tok) >= 43 and tok != tok2  # 256 random bits, url-safe base64
    assert sid2.startswith("ue-1.") and token_matches(sid, tok) and token_matches(sid2, tok2)
    assert not token_matches(sid, tok2) and not token_matches(sid2, tok) and not token_matches(sid, None)
    assert not token_matches("ue-1." + sid, tok + "x")


def test_session_calls_need_the_token_and_a_resume_elsewhere_accepts_it():
    a, b = front(agent_id="a"), front(agent_id="b")
    n = 200

    async def go():
        async with fk.ServedApp(a.app) as sa, fk.ServedApp(b.app) as sb, httpx.AsyncClient() as c:
            b.directory["a"] = sa.url
            ue = UESession(sa.url, ue_id="u")
            await ue.open(prompt_token_ids=PROMPT, max_tokens=n)
            _, other_token = new_session_credentials()
            url = f"{sa.url}/v1/sessions/{ue.session_id}"
            out = {}
            for name, hdr in (("none", {}), ("wrong", bearer(other_token))):
                out[name] = [(await c.get(url, headers=hdr)).status_code,
                             (await c.get(url + "/stream", headers=hdr)).status_code,
                             (await c.delete(url, headers=hdr)).status_code]
            out["right"] = (await c.get(url, headers=bearer(ue.token))).status_code
            # At B (which never saw the session): a wrong token is refused before any relay.
            out["b_wrong"] = (await c.get(f"{sb.url}/v1/sessions/{ue.session_id}/stream",
                                          params={"origin": sa.url}, headers=bearer(other_token))).status_code
            async for rec in ue.tokens():
                if rec.index == 9 and not ue.handovers:
                    await ue.handover(sb.url)  # B relays A, passing the UE's token on
            out["delete_right"] = (await c.delete(url, headers=bearer(ue.token))).status_code
            await ue.close()
            return out, ue

    out, ue = run(go())
    assert out["none"] == [401, 401, 401] and out["wrong"] == [403, 403, 403] and out["right"] == 200
    assert out["b_wrong"] == 403
    assert ue.token_ids == [fk.expected_token(PROMPT, i) for i in range(n)]
    assert ue.end["state"] == "finished"
    assert all(r.relayed_by == "b" for r in ue.records[ue.handovers[0].next_index:])
    assert out["delete_right"] == 200


def test_listing_needs_the_operator_credential():
    plain, op = front(), front(operator_token="op-secret-1")

    async def go():
        async with fk.ServedApp(plain.app) as s1, fk.ServedApp(op.app) as s2, httpx.AsyncClient() as c:
            r = await c.post(f"{s2.url}/v1/sessions", json={"prompt_token_ids": PROMPT, "stream": False})
            sid = r.json()["session_id"]
            return [(await c.get(f"{s1.url}/v1/sessions", headers=bearer("op-secret-1"))).status_code,
                    (await c.get(f"{s2.url}/v1/sessions")).status_code,
                    (await c.get(f"{s2.url}/v1/sessions", headers=bearer("op-secret-2"))).status_code,
                    await c.get(f"{s2.url}/v1/sessions", headers=bearer("op-secret-1")),
                    (await c.delete(f"{s2.url}/v1/sessions/{sid}", headers=bearer("op-secret-1"))).status_code,
                    sid]

    no_cred_configured, none, wrong, ok, op_delete, sid = run(go())
    assert (no_cred_configured, none, wrong) == (403, 403, 403)
    assert ok.status_code == 200 and [s["session_id"] for s in ok.json()["sessions"]] == [sid]
    assert op_delete == 200


def test_the_replay_stops_leftover_sessions_with_the_operator_credential():
    """pallas_eval.replay.end_sessions lists and deletes every live session at each agent."""
    import types

    from pallas_eval import replay as rp

    f = SessionFront(SessionStore(), fk.FakeVllmClient(0.05), agent_id="a", operator_token=rp.OPERATOR_TOKEN)

    async def go():
        async with fk.ServedApp(f.app) as srv, httpx.AsyncClient() as c:
            for _ in range(3):
                await c.post(f"{srv.url}/v1/sessions", json={"prompt_token_ids": PROMPT, "max_tokens": 1000,
                                                             "stream": False})
            server = types.SimpleNamespace(agent=types.SimpleNamespace(front_url=srv.url), agent_id="a")
            return await asyncio.to_thread(rp.end_sessions, [server], 10.0)

    assert run(go()) == 3
    assert [(s.state.value, s.finish_reason) for s in f.store] == [("finished", "abort")] * 3


def test_origin_outside_the_peer_fronts_is_never_fetched():
    """SSRF: a resume's origin must be a configured peer agent's front."""
    hits = []

    async def recorder(scope, receive, send):  # a server the front must never be made to call
        if scope["type"] == "http":
            hits.append(scope["path"])
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    b = front(agent_id="b")

    async def go():
        async with fk.ServedApp(recorder) as evil, fk.ServedApp(b.app) as sb, httpx.AsyncClient() as c:
            b.directory["a"] = "http://127.0.0.1:9"  # a peer, not the recorder
            sid, tok = new_session_credentials()
            r = await c.get(f"{sb.url}/v1/sessions/{sid}/stream", params={"origin": evil.url},
                            headers=bearer(tok))
            return r

    r = run(go())
    assert r.status_code == 400 and "peer agent" in r.json()["error"]["message"]
    assert hits == []


def test_a_peer_cannot_redirect_a_relay_outside_the_peer_fronts():
    """A relayed origin's end event names ``moved_to_url``: followed only if it is a peer front."""
    hits = []

    async def recorder(scope, receive, send):
        if scope["type"] == "http":
            hits.append(scope["path"])
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    b = front(agent_id="b")
    sid, tok = new_session_credentials()

    async def go():
        async with fk.ServedApp(recorder) as evil:
            async def origin(scope, receive, send):  # a peer whose stream ends "handed over" to evil
                if scope["type"] != "http":
                    return
                end = {"object": "session.end", "session_id": sid, "next_index": 0, "state": "handed_over",
                       "finish_reason": None, "agent_id": "a", "moved_to": "zzz", "moved_to_url": evil.url}
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream")]})
                await send({"type": "http.response.body", "body": b"data: " + json.dumps(end).encode() + b"\n\n"
                            + b"data: [DONE]\n\n"})

            async with fk.ServedApp(origin) as sa, fk.ServedApp(b.app) as sb, httpx.AsyncClient() as c:
                b.directory["a"] = sa.url
                r = await c.get(f"{sb.url}/v1/sessions/{sid}/stream", params={"origin": sa.url},
                                headers=bearer(tok))
                return r

    r = run(go())
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.status_code == 200 and events[-1]["state"] == "handed_over" and events[-1]["relayed_by"] == "b"
    assert hits == []


@pytest.mark.parametrize("chunked", [False, True])
def test_body_cap_at_limit_and_limit_plus_one(chunked):
    limit = 4096
    f = front(max_body_bytes=limit)
    head = json.dumps({"prompt_token_ids": PROMPT, "stream": False}).encode()
    at_limit = head + b" " * (limit - len(head))

    async def go():
        async with fk.ServedApp(f.app) as srv, httpx.AsyncClient() as c:
            async def send(body: bytes):
                if chunked:  # no content-length: the cap holds on the bytes read
                    async def gen():
                        for i in range(0, len(body), 1000):
                            yield body[i:i + 1000]
                    return await c.post(f"{srv.url}/v1/sessions", content=gen())
                return await c.post(f"{srv.url}/v1/sessions", content=body)
            return await send(at_limit), await send(at_limit + b" ")

    ok, over = run(go())
    assert len(at_limit) == limit
    assert ok.status_code == 200, ok.text
    assert over.status_code == 413 and str(limit) in over.json()["error"]["message"]
    assert len(f.store) == 1


def test_default_body_cap():
    assert front().max_body_bytes == MAX_BODY_BYTES == 1 << 20


def test_length_caps_take_their_limit():
    """The field-length caps at their limits (one more: test_bad_field_is_refused_naming_it)."""
    r = parse({"prompt_token_ids": [1], "stop_token_ids": [1] * 1024, "ue_id": "u" * 128,
               "session_id": "a" * 64})
    assert (len(r.stop_token_ids), len(r.ue_id), len(r.session_id)) == (1024, 128, 64)
