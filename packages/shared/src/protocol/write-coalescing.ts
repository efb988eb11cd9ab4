/**
 * Write coalescing for a busy connection (issue 46, PROTOCOL.md §21.2.2). Every script call leaves in a socket write of
 * its own, read by Redis with a system call of its own. While a client is marked busy (the gateway: more than one
 * `/mcp` POST in flight; a worker: more than one run), the first script call of an event-loop turn holds the client's
 * socket (Node's `cork`) until the end of that turn (`setImmediate`): the calls of every request or run that turn
 * served leave in one write. Nothing is reordered, and nothing waits past the turn or for a reply.
 *
 * Hand-written rather than ioredis's `enableAutoPipelining`, which batches the same commands through a `Pipeline`
 * built per turn (copying every defined script onto it) and sends a turn's pipeline only once the one before it is
 * answered: at 32 in flight that cost the gateway and the worker more CPU than the saved system calls gave back, and
 * plain calls lost throughput (docs/PERFORMANCE.md, "Writes held to the end of the turn"). A Cluster client writes to
 * one socket per node and is left as it is.
 *
 * A connection whose commands another library sends (BullMQ's, in a worker: `moveToActive` and `moveToFinished` are
 * BullMQ's calls, not ours) is held on every command instead (`coalesceEveryCommand`).
 */
import { Redis, type Cluster } from 'ioredis';

/** Clients whose script calls hold their socket to the end of the turn. */
const busy = new WeakSet<object>();
/** Sockets held until the end of this turn. */
const held = new WeakSet<object>();

/** Marks `client` busy (its script calls coalesce their writes) or not. */
export function setWriteCoalescing(client: Redis | Cluster, on: boolean): void {
  if (on) busy.add(client);
  else busy.delete(client);
}

/**
 * Makes every command `client` sends hold its socket the same way while it is busy, not only taskrelay's script calls:
 * for a connection whose commands a library sends (BullMQ's worker connection). A cluster client is left as it is.
 */
export function coalesceEveryCommand(client: Redis | Cluster): void {
  if (!(client instanceof Redis)) return;
  const send = client.sendCommand.bind(client);
  client.sendCommand = (...args: Parameters<Redis['sendCommand']>) => {
    coalesceWrites(client);
    return send(...args);
  };
}

/**
 * Called before a script call is sent: while `client` is busy, holds its socket until the end of this turn (once per
 * turn), so the calls made in the rest of the turn leave with it.
 */
export function coalesceWrites(client: Redis | Cluster): void {
  if (!busy.has(client) || !(client instanceof Redis)) return;
  const stream = client.stream as Redis['stream'] | undefined;
  if (!stream || held.has(stream) || !stream.writable) return;
  held.add(stream);
  stream.cork();
  setImmediate(() => {
    held.delete(stream);
    stream.uncork();
  });
}
