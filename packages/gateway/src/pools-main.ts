#!/usr/bin/env node
/**
 * `node packages/gateway/dist/pools-main.js [list | retire POOL]`: an operator's view of the pools the catalog
 * remembers (PROTOCOL.md §24), with the gateway's environment (`REDIS_URL`, `TASKRELAY_PREFIX`,
 * `TASKRELAY_CATALOG_RETENTION_MS`). `retire` forgets a pool before its retention ends: its tools leave `tools/list`,
 * and new calls for them get `Unknown tool`, once no other pool serves them. A pool whose tool versions live tasks last
 * ran is `kept` (§24.9): `list` names those versions, and `retire` refuses it unless `--force`.
 */
import { parseArgs } from 'node:util';
import {
  TaskStore,
  createKeys,
  keyLayoutOf,
  createRedis,
  loadGatewayConfig,
  oneLine,
  requireRedisUrl,
} from '@taskrelay/shared';
import { VERSION_SCAN_LIMIT, rememberedPools, retirePool, versionsKeeping } from './tasks/catalog.js';

const USAGE = 'usage: pools-main.js [list | retire POOL [--force]]';

async function main(): Promise<number> {
  const { positionals, values } = parseArgs({
    allowPositionals: true,
    options: { force: { type: 'boolean', default: false } },
  });
  const [command = 'list', poolArg, ...rest] = positionals;
  if (!['list', 'retire'].includes(command) || rest.length > 0 || (command === 'retire') !== (poolArg !== undefined)) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const config = loadGatewayConfig();
  const keys = createKeys(config.prefix, keyLayoutOf(config.redisUrl, config.prefix, config.keyLayout));
  const redis = createRedis(requireRedisUrl(config), { maxRetriesPerRequest: 1 });
  try {
    const inUse = await new TaskStore(redis, keys).records.liveToolVersions(VERSION_SCAN_LIMIT);
    if (command === 'list') {
      const now = Date.now();
      for (const p of await rememberedPools(redis, keys)) {
        const ageS = Math.round((now - p.lastSeenAt) / 1000);
        const keeping = versionsKeeping(p, inUse);
        const state =
          keeping.length > 0
            ? `kept: live tasks last ran ${keeping.map((v) => `${v.tool} ${v.version}`).join(', ')}`
            : now - p.lastSeenAt > config.catalogRetentionMs
              ? 'past retention'
              : 'listed';
        // The pool's name is a digest of its tools at their versions (§24.9): name both.
        const tools = p.tools.map((t) => (t.version === undefined ? t.name : `${t.name}@${t.version}`)).join(',');
        process.stdout.write(`${p.pool}\t${state}\tlast seen ${ageS} s ago\t${tools}\n`);
      }
      return 0;
    }
    const pool = poolArg ?? '';
    const outcome = await retirePool(redis, keys, pool, { inUse, force: values.force });
    const messages = {
      kept: `pool ${pool} published tool versions live tasks last ran: they may still resume on it; --force retires it anyway`,
      retired: `pool ${pool} retired: its tools are no longer listed unless another pool serves them`,
      unknown: `pool ${pool} is not remembered (already retired or past its retention)`,
      live: `pool ${pool} still has live workers: stop them first, then retire it`,
    };
    (outcome === 'retired' ? process.stdout : process.stderr).write(`${messages[outcome]}\n`);
    return outcome === 'retired' ? 0 : 1;
  } finally {
    redis.disconnect();
  }
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`taskrelay pools: ${oneLine(error)}\n`);
    process.exit(1);
  },
);
