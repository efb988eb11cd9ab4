/** One MCP session with the gateway, on the SDK's client, with what the CLI needs around it. */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { createRequire } from 'node:module';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, type ElicitRequest, type ElicitResult } from '@modelcontextprotocol/sdk/types.js';

/** As packages/cli/package.json says (beside `src/` and `dist/` alike). */
export const CLI_VERSION: string = (createRequire(import.meta.url)('../package.json') as { version: string }).version;

/**
 * Answers an elicitation request (a tool asking the user something). The hook for `input_required` tasks: the CLI
 * declares the `elicitation` capability only when one is given (on a TTY), and the SDK routes the server's
 * `elicitation/create` requests — also those carried by a blocked `tasks/result` — here.
 */
export type ElicitationHandler = (request: ElicitRequest['params']) => Promise<ElicitResult>;

export interface ConnectOptions {
  url: string;
  token: string | undefined;
  elicit?: ElicitationHandler;
}

export interface Connection {
  client: Client;
  /**
   * Waits for every message already handed to the transport (a `notifications/cancelled` sent on abort, a
   * `tasks/cancel`), then ends the session. Exiting before that could drop the cancel on the floor.
   */
  close(): Promise<void>;
}

export async function connect(options: ConnectOptions): Promise<Connection> {
  const headers: Record<string, string> = {};
  if (options.token !== undefined) headers['Authorization'] = `Bearer ${options.token}`;
  const transport = new StreamableHTTPClientTransport(new URL(options.url), { requestInit: { headers } });
  const sends = new Set<Promise<void>>();
  const send = transport.send.bind(transport);
  transport.send = (message, sendOptions) => {
    const sent = send(message, sendOptions);
    sends.add(sent);
    const forget = () => sends.delete(sent);
    sent.then(forget, forget);
    return sent;
  };
  const client = new Client(
    { name: 'taskrelay-cli', version: CLI_VERSION },
    { capabilities: options.elicit ? { elicitation: { form: {} } } : {} },
  );
  if (options.elicit) client.setRequestHandler(ElicitRequestSchema, oneQuestionAtATime(options.elicit));
  await client.connect(transport);
  return {
    client,
    close: async () => {
      await Promise.allSettled([...sends]);
      await transport.terminateSession().catch(() => undefined);
      await client.close();
    },
  };
}

/**
 * The terminal asks one question at a time (two prompts on one stdin would read each other's answers), and asks a
 * question once while it is open: the gateway may deliver one input request on two streams of the session (the GET
 * stream and a `tasks/result`, PROTOCOL.md §19), and both deliveries get the one answer.
 */
function oneQuestionAtATime(elicit: ElicitationHandler): (request: ElicitRequest) => Promise<ElicitResult> {
  const open = new Map<string, Promise<ElicitResult>>();
  let queue: Promise<unknown> = Promise.resolve();
  return (request) => {
    const { _meta: meta, ...question } = request.params;
    // Same task, same question: the same input request (other _meta, such as a progress token, may differ).
    const key = JSON.stringify([meta?.['io.modelcontextprotocol/related-task'] ?? null, question]);
    const asked = open.get(key);
    if (asked) return asked;
    const answer = queue.then(() => elicit(request.params));
    queue = answer.catch(() => undefined);
    open.set(key, answer);
    const forget = () => open.delete(key);
    answer.then(forget, forget);
    return answer;
  };
}
