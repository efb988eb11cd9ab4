// Copies the Lua commands beside the compiled code (src/protocol/commands → dist/protocol/commands), as BullMQ ships its commands in
// dist: tsc copies no .lua, and scripts.ts reads them from beside itself at run time.
import { cpSync, rmSync } from 'node:fs';

const from = new URL('./src/protocol/commands/', import.meta.url);
const to = new URL('./dist/protocol/commands/', import.meta.url);
rmSync(to, { recursive: true, force: true });
cpSync(from, to, { recursive: true, filter: (source) => !source.includes('/.') });
