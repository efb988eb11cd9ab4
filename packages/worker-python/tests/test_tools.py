import json

import pytest
from pydantic import BaseModel

from taskrelay_worker import NonRetryableError, RetryAfterError, define_tool, tool
from taskrelay_worker.task_codec import _json
from taskrelay_worker.tools import collect_tools, to_tool_result


async def run(args, ctx):
    return args


def test_the_decorator_and_define_tool_describe_the_same_tool():
    @tool(name="t", description="d", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    async def t(args, ctx):
        return args

    assert t.descriptor() == {
        "name": "t",
        "description": "d",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "taskSupport": "optional",
        "attempts": 1,
        "maxStalls": 10,
        "version": t.version,
    }


def test_a_version_is_explicit_or_derived_from_name_schema_and_source():
    async def other(args, ctx):
        return "other"

    a = define_tool(name="t", description="d", run=run)
    assert len(a.version) == 12 and a.version == define_tool(name="t", description="d", run=run).version
    assert define_tool(name="t", description="d", run=other).version != a.version
    assert define_tool(name="t", description="d", run=run, input_schema={"type": "object", "properties": {"x": {}}}).version != a.version
    explicit = define_tool(name="t", description="d", run=run, version="2.0", on_version_change="restart")
    assert explicit.descriptor()["version"] == "2.0" and explicit.descriptor()["onVersionChange"] == "restart"
    with pytest.raises(ValueError, match="version"):
        define_tool(name="t", description="d", run=run, version="two words")
    with pytest.raises(ValueError, match="on_version_change"):
        define_tool(name="t", description="d", run=run, on_version_change="retry")


def test_an_option_the_worker_does_not_know_is_refused_at_definition():
    with pytest.raises(TypeError):
        define_tool(name="t", description="d", run=run, retries=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="rate_limit"):
        define_tool(name="t", description="d", run=run, rate_limit={"max": 1, "per_ms": 10, "per": ["a"]})
    with pytest.raises(ValueError, match="rate_limit.key names a, which input_schema does not"):
        define_tool(name="t", description="d", run=run, rate_limit={"max": 1, "per_ms": 10, "key": ["a"]})
    with pytest.raises(ValueError, match="concurrency"):
        define_tool(name="t", description="d", run=run, concurrency={"limit": 1, "by": ["a"]})
    with pytest.raises(TypeError, match="async"):
        define_tool(name="t", description="d", run=lambda a, c: None)
    with pytest.raises(ValueError, match="name"):
        define_tool(name="bad name", description="d", run=run)


def test_a_pydantic_model_gives_the_schema_and_validates_the_arguments():
    class Args(BaseModel):
        epochs: int
        rate: float = 0.1

    t = define_tool(name="train", description="d", run=run, input_schema=Args, concurrency=2, rate_limit={"max": 5, "per_ms": 1000})
    assert t.input_schema["properties"]["epochs"]["type"] == "integer"
    assert t.descriptor()["concurrency"] == 2
    assert t.descriptor()["rateLimit"] == {"max": 5, "perMs": 1000}
    assert t.parse_arguments({"epochs": 3}).epochs == 3
    with pytest.raises(NonRetryableError, match="epochs"):
        t.parse_arguments({"epochs": "many"})


def test_results_become_call_tool_results():
    t = define_tool(name="t", description="d", run=run)
    assert to_tool_result(t, {"a": 1}) == {"content": [{"type": "text", "text": '{"a":1}'}], "structuredContent": {"a": 1}}
    assert to_tool_result(t, "hi") == {"content": [{"type": "text", "text": "hi"}]}
    own = {"content": [{"type": "text", "text": "x"}], "isError": True}
    assert to_tool_result(t, own) is own
    with pytest.raises(NonRetryableError):
        to_tool_result(t, {"content": [{"text": "no type"}]})


def test_a_result_with_nan_or_infinity_is_stored_as_json_text_any_parser_reads_as_node_writes_it():
    # JSON.stringify({x: NaN, y: [Infinity, -Infinity], z: 1.5}) in the Node worker: '{"x":null,"y":[null,null],"z":1.5}'.
    t = define_tool(name="t", description="d", run=run)
    value = {"x": float("nan"), "y": [float("inf"), float("-inf")], "z": 1.5}
    result = to_tool_result(t, value)
    assert result["content"][0]["text"] == '{"x":null,"y":[null,null],"z":1.5}'
    stored = _json(result)
    assert json.loads(stored, parse_constant=lambda c: pytest.fail(f"{c} is not JSON")) == {
        "content": [{"type": "text", "text": '{"x":null,"y":[null,null],"z":1.5}'}],
        "structuredContent": {"x": None, "y": [None, None], "z": 1.5},
    }
    # Anything else json.dumps refuses is still refused.
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        _json(loop)


def test_a_module_lists_its_tools_once():
    t = define_tool(name="t", description="d", run=run)
    assert collect_tools({"t": t, "x": 1}) == [t]
    with pytest.raises(ValueError, match="more than once"):
        collect_tools({"TOOLS": [t, t]})
    with pytest.raises(ValueError, match="no tools"):
        collect_tools({})


def test_retry_after_takes_seconds():
    assert RetryAfterError(1.5, "slow down").retry_after == 1.5
    with pytest.raises(ValueError):
        RetryAfterError(-1)


def test_limits_per_key_and_shared_by_name_are_the_worker_s_own():
    """PROTOCOL.md §3.5: a keyed or shared limit is admitted by the worker, never set on BullMQ's queue, and published
    as the Node worker publishes it; the key is the JSON of the named arguments' values, hashed as on the Node side."""
    from taskrelay_worker.limits import key_function, limit_key_digest

    schema = {"type": "object", "properties": {"tenant": {"type": "string"}, "region": {"type": "string"}}}
    t = define_tool(
        name="keyed",
        description="d",
        run=run,
        input_schema=schema,
        concurrency={"limit": 2, "key": ["tenant", "region"]},
        rate_limit={"max": 5, "per_ms": 1000, "name": "billing"},
    )
    assert t.concurrency is None and t.rate_limit is None
    d = t.descriptor()
    assert d["concurrency"] == 2 and d["concurrencyKey"] == ["tenant", "region"]
    assert d["rateLimit"] == {"max": 5, "perMs": 1000, "name": "billing"}
    assert t.admitted_rate is not None and t.admitted_rate.scope == "name:billing"
    assert key_function(["tenant", "region"])({"tenant": "acme"}) == '["acme",null]'
    # The Node side's digest of the same value (createHash('sha256').update(v).digest('base64url').slice(0, 22)).
    assert limit_key_digest('["acme",null]') == "Bcy2JyxMKQSNw3BgtWBBsJ"
    plain = define_tool(name="plain", description="d", run=run, concurrency={"limit": 3}, rate_limit={"max": 1, "per_ms": 10})
    assert plain.concurrency == 3 and plain.rate_limit == (1, 10) and plain.admitted_slot is None
    # A plain rate limit is paced by bullmq's limiter and counted exactly by the worker, one budget for everyone (§3.3).
    assert plain.admitted_rate is not None and plain.admitted_rate.paced
    assert plain.admitted_rate.scope == "tool:plain" and plain.admitted_rate.across_principals
    assert plain.descriptor()["rateLimit"] == {"max": 1, "perMs": 10}
    assert t.admitted_rate is not None and not t.admitted_rate.paced


def test_keyed_limits_count_per_principal_unless_shared_across_principals():
    """PROTOCOL.md §3.5 (issue 48 F2): a keyed limit's key is the principal's, as the Node side builds it, unless the
    tool says ``across_principals``; a named limit without a key is everyone's."""
    from taskrelay_worker.limits import limit_key_digest, principal_scoped_key, scoped_key

    schema = {"type": "object", "properties": {"tenant": {"type": "string"}}}
    mine = define_tool(
        name="mine", description="d", run=run, input_schema=schema,
        concurrency={"limit": 1, "key": ["tenant"]}, rate_limit={"max": 1, "per_ms": 10, "key": ["tenant"]},
    )
    shared = define_tool(
        name="shared", description="d", run=run, input_schema=schema,
        concurrency={"limit": 1, "key": ["tenant"], "across_principals": True},
        rate_limit={"max": 1, "per_ms": 10, "key": ["tenant"], "across_principals": True},
    )
    upstream = define_tool(name="upstream", description="d", run=run, rate_limit={"max": 1, "per_ms": 10, "name": "up"})
    args = {"tenant": "acme"}
    assert mine.admitted_slot is not None and mine.admitted_rate is not None
    assert scoped_key(mine.admitted_slot, args, "alice") == 'alice\u0000["acme"]'
    assert scoped_key(mine.admitted_slot, args, "bob") != scoped_key(mine.admitted_slot, args, "alice")
    assert scoped_key(mine.admitted_rate, args, "bob") == principal_scoped_key("bob", '["acme"]')
    assert shared.admitted_slot is not None and shared.admitted_rate is not None
    assert scoped_key(shared.admitted_slot, args, "alice") == scoped_key(shared.admitted_slot, args, "bob") == '["acme"]'
    assert scoped_key(shared.admitted_rate, args, "alice") == '["acme"]'
    assert upstream.admitted_rate is not None and scoped_key(upstream.admitted_rate, {}, "alice") == ""
    # The Node side's digest of alice's acme key: limitKeyDigest(principalScopedKey('alice', '["acme"]')).
    assert limit_key_digest(principal_scoped_key("alice", '["acme"]')) == "Q3gMPoo7p3CHY5z59k1YUY"
    with pytest.raises(ValueError, match="across_principals must be true or false"):
        define_tool(name="bad", description="d", run=run, input_schema=schema,
                    concurrency={"limit": 1, "key": ["tenant"], "across_principals": "yes"})


def test_dedupe_is_carried_in_the_catalog_as_node_carries_it():
    schema = {"type": "object", "properties": {"report": {"type": "string"}, "ms": {"type": "integer"}}}
    keyed = define_tool(name="k", description="d", run=run, input_schema=schema, dedupe={"key": ["report"], "ttl_ms": 5000})
    assert keyed.descriptor()["dedupe"] == {"key": ["report"], "ttlMs": 5000}
    every = define_tool(name="e", description="d", run=run, input_schema=schema, dedupe=True)
    assert every.descriptor()["dedupe"] == {"ttlMs": 3_600_000}
    assert "dedupe" not in define_tool(name="n", description="d", run=run, input_schema=schema).descriptor()


@pytest.mark.parametrize(
    "dedupe, message",
    [
        ({"key": ["nope"]}, "dedupe.key names nope, which input_schema does not"),
        ({"key": []}, "dedupe.key must be a non-empty list"),
        ({"ttl_ms": 0}, "dedupe.ttl_ms must be a whole number"),
        ({"ttlMs": 5}, "dedupe must be True or"),
        ("yes", "dedupe must be True or"),
    ],
)
def test_a_bad_dedupe_is_refused_when_the_module_loads(dedupe, message):
    schema = {"type": "object", "properties": {"report": {"type": "string"}}}
    with pytest.raises(ValueError, match=message):
        define_tool(name="t", description="d", run=run, input_schema=schema, dedupe=dedupe)
