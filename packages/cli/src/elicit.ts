/**
 * Answers a tool's question on the terminal (elicitation, form mode): one prompt per field of the requested schema.
 * Only offered on a TTY (`connection.ts` declares the capability when this handler is given); an empty answer cancels.
 * Tested end to end with `wait_for_approval` in test/cli-tty.e2e.test.ts.
 */
import { createInterface } from 'node:readline/promises';
import type { ElicitResult } from '@modelcontextprotocol/sdk/types.js';
import type { ElicitationHandler } from './connection.js';
import { pauseBars } from './output.js';

interface FieldSchema {
  type?: string;
  title?: string;
  description?: string;
  enum?: unknown[];
}

export function terminalElicitation(input: NodeJS.ReadStream, output: NodeJS.WriteStream): ElicitationHandler {
  return async (params) => {
    if (!('requestedSchema' in params)) return { action: 'decline' };
    // Live bars redraw their rows over anything printed there, the prompt and the typed answer included: they stop
    // for the question and come back below the answer.
    const resume = pauseBars?.();
    const rl = createInterface({ input, output });
    try {
      output.write(`${params.message}\n`);
      const content: NonNullable<ElicitResult['content']> = {};
      const properties = (params.requestedSchema.properties ?? {}) as Record<string, FieldSchema>;
      for (const [name, field] of Object.entries(properties)) {
        const hint = field.type === 'boolean' ? ' [y/n]' : field.enum ? ` (${field.enum.join('/')})` : '';
        const answer = (await rl.question(`${field.title ?? name}${hint}: `)).trim();
        if (answer === '') return { action: 'cancel' };
        if (field.type === 'boolean') content[name] = /^y(es)?$/i.test(answer);
        else if (field.type === 'number' || field.type === 'integer') content[name] = Number(answer);
        else content[name] = answer;
      }
      return { action: 'accept', content };
    } finally {
      rl.close();
      resume?.();
    }
  };
}
