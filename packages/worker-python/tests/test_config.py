import pytest

from taskrelay_worker.config import ConfigError, load_config

BASE = {"REDIS_URL": "redis://127.0.0.1:6379", "TASKRELAY_TOOLS": "tools.py"}


def test_defaults_are_the_node_workers():
    config = load_config(BASE)
    assert (config.prefix, config.queue, config.concurrency) == ("taskrelay", "default", 8)
    assert (config.lock_duration_ms, config.shutdown_grace_ms, config.heartbeat_ms) == (30_000, 30_000, 5_000)
    assert (config.cancel_sweep_ms, config.abort_grace_ms, config.progress_interval_ms) == (2_000, 5_000, 50)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"TASKRELAY_TOOLS": "t.py"}, "Invalid configuration: REDIS_URL is required (for example redis://127.0.0.1:6379)"),
        ({**BASE, "REDIS_URL": "http://x"}, "Invalid configuration: REDIS_URL must be a redis:// or rediss:// URL"),
        ({**BASE, "WORKER_CONCURRENCY": "0"}, "Invalid configuration: WORKER_CONCURRENCY must be at least 1 (got 0)"),
        ({**BASE, "WORKER_LOCK_DURATION_MS": "abc"}, "Invalid configuration: WORKER_LOCK_DURATION_MS must be a whole number (got 'abc')"),
        ({**BASE, "TASKRELAY_QUEUE": "a b"}, "Invalid configuration: TASKRELAY_QUEUE must be letters, digits, _ . or -"),
        ({**BASE, "LOG_LEVEL": "loud"}, "Invalid configuration: LOG_LEVEL must be one of trace, debug, info, warn, error, fatal, silent (got 'loud')"),
        ({**BASE, "REDIS_CLUSTER_NODES": "a:1", "TASKRELAY_KEY_LAYOUT": "single"}, "Invalid configuration: TASKRELAY_PREFIX must be wrapped in {} on a Redis Cluster with the single key layout (one hash slot for every key), e.g. {taskrelay}, or be unbraced with TASKRELAY_KEY_LAYOUT=auto (got 'taskrelay')"),
        ({**BASE, "TASKRELAY_KEY_LAYOUT": "sharded", "TASKRELAY_PREFIX": "{tr}"}, "Invalid configuration: TASKRELAY_PREFIX must have no braces with the sharded key layout (TASKRELAY_KEY_LAYOUT=sharded), e.g. tr (got '{tr}')"),
        ({**BASE, "TASKRELAY_KEY_LAYOUT": "split"}, "Invalid configuration: TASKRELAY_KEY_LAYOUT must be one of auto, single, sharded (got 'split')"),
        ({**BASE, "REDIS_CLUSTER_NODES": "a:b"}, "Invalid configuration: REDIS_CLUSTER_NODES must be a comma list of host:port (bad entry 'a:b')"),
        ({**BASE, "REDIS_SENTINELS": "s:26379"}, "Invalid configuration: REDIS_SENTINEL_NAME (the master name) is required with REDIS_SENTINELS"),
        ({"REDIS_URL": "redis://h:1"}, None),
    ],
)
def test_a_bad_configuration_is_one_line_naming_the_variable(env, line):
    with pytest.raises(ConfigError) as raised:
        load_config(env)
    message = str(raised.value)
    assert "\n" not in message
    if line is not None:
        assert message == line


def test_a_cluster_or_sentinels_replace_redis_url():
    config = load_config({"REDIS_CLUSTER_NODES": "10.0.0.1:7000, [::1]:7001", "TASKRELAY_PREFIX": "{tr}", "TASKRELAY_TOOLS": "t.py"})
    assert config.redis.cluster_nodes == (("10.0.0.1", 7000), ("::1", 7001))
    sentinel = load_config({**BASE, "REDIS_SENTINELS": "s1:26379", "REDIS_SENTINEL_NAME": "mymaster"})
    assert sentinel.redis.sentinels == (("s1", 26379),) and sentinel.redis.sentinel_name == "mymaster"


def test_waitpoint_secret_is_read_and_a_short_one_refused():
    base = {"REDIS_URL": "redis://127.0.0.1:6379", "TASKRELAY_TOOLS": "tools.py"}
    assert load_config(base).waitpoint_secret is None
    assert load_config({**base, "TASKRELAY_WAITPOINT_SECRET": "s" * 32}).waitpoint_secret == "s" * 32
    with pytest.raises(ConfigError, match="TASKRELAY_WAITPOINT_SECRET must be at least 32 characters"):
        load_config({**base, "TASKRELAY_WAITPOINT_SECRET": "short"})


def test_an_s3_blob_store_is_refused_not_ignored():
    base = {"REDIS_URL": "redis://127.0.0.1:6379", "TASKRELAY_TOOLS": "tools.py"}
    assert load_config({**base, "TASKRELAY_BLOB_STORE": "redis"}).redis_url
    with pytest.raises(ConfigError, match="TASKRELAY_BLOB_STORE=s3 is not supported by the Python worker yet"):
        load_config({**base, "TASKRELAY_BLOB_STORE": "s3"})


@pytest.mark.parametrize(
    ("env", "layout"),
    [
        ({**BASE}, "single"),
        ({**BASE, "TASKRELAY_KEY_LAYOUT": "sharded"}, "sharded"),
        ({**BASE, "REDIS_CLUSTER_NODES": "a:1"}, "sharded"),
        ({**BASE, "REDIS_CLUSTER_NODES": "a:1", "TASKRELAY_PREFIX": "{tr}"}, "single"),
    ],
)
def test_the_key_layout_resolves_as_the_node_processes_resolve_it(env, layout):
    """redis.ts `keyLayoutOf` (PROTOCOL.md §1.1): `auto` is sharded on a Cluster with an unbraced prefix."""
    assert load_config(env).key_layout == layout
