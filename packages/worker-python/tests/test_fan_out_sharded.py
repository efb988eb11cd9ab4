"""A Python parent's batch in the sharded key layout (PROTOCOL.md §26.10, issue 45) where it is pure: which shard each
child goes to, the keys a re-add names on a child's shard, and where a stop sends each child's removal and cancel. The
cross-process flow is test/python-parent-sharded.e2e.test.ts."""

import asyncio
import json

from taskrelay_worker.batch_parent import BatchParent
from taskrelay_worker.batch_store import by_shard, child_shard
from taskrelay_worker.keys import Keys
from taskrelay_worker.protocol import BATCH_FIELDS

CODES = ["0a0a", "1b1b", "2c2c"]
PARENT = "ffff-parent"


def test_child_i_goes_to_shard_i_mod_n_and_nowhere_without_codes():
    assert [child_shard(CODES, i) for i in range(7)] == ["0a0a", "1b1b", "2c2c", "0a0a", "1b1b", "2c2c", "0a0a"]
    assert child_shard(None, 5) is None
    assert child_shard([], 5) is None


def test_indices_group_by_their_shard_as_positions():
    # Positions into the list, so each shard's answers go back to their own children.
    assert by_shard(CODES, [4, 5, 6, 7, 9]) == {"1b1b": [0, 3], "2c2c": [1], "0a0a": [2, 4]}
    assert by_shard(None, [4, 5]) == {None: [0, 1]}
    assert by_shard(CODES, []) == {}


def test_a_re_add_names_the_batch_keys_on_the_childs_shard_only():
    keys = Keys("tr", "sharded")
    assert keys.batch(PARENT) == "tr:{ffff}:batch:ffff-parent"
    on = keys.for_shard("1b1b")
    # The parent's shard by default (its id names it), the child's shard when asked: one slot per script call.
    assert on.batch(PARENT, "open") == "tr:{ffff}:batch:ffff-parent:open"
    assert on.batch(PARENT, "open", here=True) == "tr:{1b1b}:batch:ffff-parent:open"
    assert Keys("tr", "single").batch(PARENT, "open", here=True) == "tr:batch:ffff-parent:open"


class Pipe:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getattr__(self, command):
        return lambda *args: self.log.append((self.name, command, *args))

    async def execute(self):
        self.log.append((self.name, "execute"))


class ShardedRedis:
    """A batch of 7 children on three shards, indices 1, 2, 4 and 6 open; records every command by pipeline."""

    def __init__(self):
        self.log = []
        self.pipes = 0

    async def hmget(self, key, names):
        fields = {
            BATCH_FIELDS["childTool"]: "child",
            BATCH_FIELDS["childPool"]: "q~child",
            BATCH_FIELDS["parentPool"]: "q~parent",
            BATCH_FIELDS["concurrency"]: "4",
            BATCH_FIELDS["failFast"]: "1",
            BATCH_FIELDS["owner"]: "alice",
            BATCH_FIELDS["childCodes"]: ",".join(CODES),
        }
        return [fields.get(n) for n in names]

    async def hset(self, key, field, value):
        self.log.append(("direct", "hset", key, field, value))

    async def smembers(self, key):
        return {"6", "1", "4", "2"}

    def pipeline(self, transaction=True):
        self.pipes += 1
        return Pipe(self.log, f"pipe{self.pipes}")


class Queue:
    def __init__(self, log, prefix):
        self.log, self.prefix = log, prefix

    async def remove(self, job_id):
        self.log.append(("queue", self.prefix, "remove", job_id))

    async def addBulk(self, jobs):
        self.log.append(("queue", self.prefix, "addBulk", [j["opts"]["jobId"] for j in jobs]))

    async def add(self, name, data, opts):
        self.log.append(("queue", self.prefix, "add", [opts["jobId"]]))


class Store:
    def __init__(self, redis):
        self.redis = redis


def sharded_parent():
    redis = ShardedRedis()
    keys = Keys("tr", "sharded")

    def queue_of(pool, job_id, on=None):
        return Queue(redis.log, (on or keys.for_task(job_id)).bull_prefix)

    return redis, keys, BatchParent(Store(redis), keys, "q", {}, queue_of)


def test_the_shape_carries_the_child_codes_a_node_or_python_parent_wrote():
    _, _, parent = sharded_parent()
    shape = asyncio.run(parent.shape(PARENT))
    assert shape is not None and shape["childCodes"] == CODES


def test_a_stop_removes_and_cancels_each_child_on_its_own_shard_and_its_open_work_on_the_parents():
    redis, keys, parent = sharded_parent()
    asyncio.run(parent.stop_children(PARENT))
    removed = [(entry[1], entry[3]) for entry in redis.log if entry[0] == "queue"]
    assert removed == [
        (keys.for_shard(child_shard(CODES, i)).bull_prefix, f"{PARENT}.{i}") for i in (1, 2, 4, 6)
    ]
    published = [e for e in redis.log if e[1] == "spublish"]
    assert [e[1] for e in redis.log if e[1] in ("publish", "spublish")] == ["spublish"] * 4
    by_pipe = {}
    for name, _command, channel, message in published:
        child = json.loads(message)["taskId"]
        code = child_shard(CODES, int(child.rsplit(".", 1)[1]))
        assert channel == keys.for_shard(code).cancel_channel
        by_pipe.setdefault(code, set()).add(name)
    # One pipeline per child shard, another for the parent's shard (the open work), each run once.
    assert all(len(names) == 1 for names in by_pipe.values()) and len({n for s in by_pipe.values() for n in s}) == 3
    open_work = [e for e in redis.log if e[1] == "zrem" and e[2] == keys.for_task(PARENT).principal_open_tasks("alice")]
    assert len(open_work) == 4 and len({e[0] for e in open_work}) == 1
    shares = sorted(e[2] for e in redis.log if e[1] == "zrem" and e not in open_work)
    assert shares == sorted(keys.for_shard(child_shard(CODES, i)).fair_share("q~child", "alice") for i in (1, 2, 4, 6))
    assert sum(1 for e in redis.log if e[1] == "execute") == redis.pipes == 4


def test_children_are_added_on_their_own_shards():
    redis, keys, parent = sharded_parent()

    async def items(key, first, last):
        return [json.dumps({"n": i}) for i in range(first, last + 1)]

    async def tool_in_pool(name, pool):
        return {"name": name}

    redis.lrange = items
    parent._child_tool_in_pool = tool_in_pool
    shape = asyncio.run(parent.shape(PARENT))
    # Child 5's priority is 0: its job is on its shard already, so it is not added.
    added = asyncio.run(parent._add_children(PARENT, shape, [3, 4, 5, 6, 7], [9, 9, 0, 9, 9], None))
    assert added == 4
    # One add per child (bullmq's addBulk pipelines EVALSHA, which a Cluster pipeline refuses).
    assert not [entry for entry in redis.log if entry[2] == "addBulk"]
    bulks = {}
    for entry in redis.log:
        if entry[2] == "add":
            bulks.setdefault(entry[1], []).extend(entry[3])
    assert bulks == {
        keys.for_shard("0a0a").bull_prefix: [f"{PARENT}.3", f"{PARENT}.6"],
        keys.for_shard("1b1b").bull_prefix: [f"{PARENT}.4", f"{PARENT}.7"],
    }
