/**
 * `@taskrelay/shared/protocol`: everything another language must honour (issue 47, PROTOCOL.md §29.2): the keys of
 * both layouts, the task fields, the scripts with their result codes, `ERROR_CODES` and the message shapes. The build
 * writes all of it into the Python worker's manifest (`protocolManifest`); nothing here reaches outside this folder.
 */
export * from './batch-fields.js';
export * from './bullmq-layout.js';
export * from './errors.js';
export * from './keys.js';
export * from './manifest.js';
export * from './messages.js';
export * from './script-results.js';
export { scriptsGeneration, loadScripts, SCRIPTS, type ScriptSpec } from './scripts.js';
export * from './task-fields.js';
export * from './task-model.js';
export * from './webhook-limits.js';
