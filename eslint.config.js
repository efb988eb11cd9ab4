// ESLint flat config for the taskrelay workspace.
//
// - `packages/*/src`: typescript-eslint's type-checked rules (through the project service, so each file is checked
//   against its own package's tsconfig), import cycles, type-only imports, functions of at most 120 lines of code, and
//   `no-console` (libraries log through pino; only the `main.ts` entry points may print).
// - Every other file (tests, benchmarks, scripts, examples, configs): the non-type-checked recommended rules,
//   console allowed.
import js from '@eslint/js';
import { defineConfig, globalIgnores } from 'eslint/config';
import { createNodeResolver, importX } from 'eslint-plugin-import-x';
import globals from 'globals';
import tseslint from 'typescript-eslint';

const SRC = ['packages/*/src/**/*.ts'];
const ENTRY_POINTS = ['packages/*/src/main.ts'];
const TS = ['**/*.ts', '**/*.mts', '**/*.cts'];
const TESTS_AND_TOOLS = ['test/**', 'packages/*/test/**', 'bench/**', 'scripts/**', 'examples/**', '*.config.ts'];

/** Unused variables are errors, except the `_`-prefixed ones kept on purpose (callback arity, destructuring). */
const noUnusedVars = [
  'error',
  {
    argsIgnorePattern: '^_',
    varsIgnorePattern: '^_',
    caughtErrorsIgnorePattern: '^_',
    destructuredArrayIgnorePattern: '^_',
    ignoreRestSiblings: true,
  },
];

/**
 * The gateway's layers, top to bottom (PROTOCOL.md §16 and ARCHITECTURE.md, whose tables `scripts/docs-layers.mjs`
 * writes from this list).
 * Each row maps its folders to what they hold. A folder imports only from the rows below its own; folders on one row
 * are peers and never import each other.
 */
export const GATEWAY_LAYERS = [
  { app: 'the composition root: wiring, the lifecycle, the session registry, the memory budget, the express app' },
  {
    admin: "the operator's pages and API: fleet and task views, read through the stores",
    'transports/session':
      '2025-11-25 sessions: the SDK `Server` per session, `initialize`, the GET stream, resumability',
    'transports/sessionless':
      '2026-07-28: one request per POST, its header checks, framing as JSON or SSE, listen streams',
  },
  {
    http: 'HTTP plumbing both transports use: auth, guards, body and rate limits, the SSE writer and its send buffers',
  },
  { protocol: 'the MCP methods once for both eras, the plain-call tracker, MRTR request state, catalog changes' },
  { wire: 'domain ↔ JSON-RPC: one module per task rendering, the error-code table, the result cap, answer checks' },
  {
    tasks:
      'the domain: task service, router, reaper, catalog, dispatcher, the open-task cap, completion webhooks, domain errors; no SDK wire type',
  },
  { metrics: "the gateway's Prometheus metrics, which every layer records into" },
];

/** One `import-x/no-restricted-paths` zone per folder: nothing from a row above it, nor from a peer on its row. */
function gatewayLayerZones() {
  const dir = (folder) => `./packages/gateway/src/${folder}`;
  const zones = [];
  GATEWAY_LAYERS.forEach((row, i) => {
    const above = GATEWAY_LAYERS.slice(0, i).flatMap((r) => Object.keys(r));
    for (const folder of Object.keys(row)) {
      const peers = Object.keys(row).filter((f) => f !== folder);
      if (above.length > 0) {
        zones.push({
          target: dir(folder),
          from: above.map(dir),
          message: `${folder}/ sits below ${above.join(', ')}: arrows point down only (PROTOCOL.md §16).`,
        });
      }
      if (peers.length > 0) {
        zones.push({
          target: dir(folder),
          from: peers.map(dir),
          message: `${folder}/ and ${peers.join(', ')} are peers and never import each other; share it a row down (PROTOCOL.md §16).`,
        });
      }
    }
  });
  return zones;
}

const GATEWAY_NO_WORKER = {
  group: ['@taskrelay/worker', '@taskrelay/worker/*', '**/worker/src/**'],
  message: 'The gateway never imports worker code; put shared vocabulary in @taskrelay/shared.',
};

export default defineConfig(
  globalIgnores(
    ['**/dist/**', '**/node_modules/**', '**/coverage/**', '.tmp/**', '.venv/**', '.venv-bench/**'],
    'taskrelay/ignores',
  ),

  {
    name: 'taskrelay/all',
    files: ['**/*.{js,mjs,cjs,ts,mts,cts}'],
    extends: [js.configs.recommended],
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    languageOptions: {
      ecmaVersion: 2023,
      sourceType: 'module',
      globals: { ...globals.node },
    },
    rules: {
      'no-unused-vars': noUnusedVars,
    },
  },

  {
    name: 'taskrelay/ts',
    files: TS,
    extends: [tseslint.configs.recommended],
    rules: {
      '@typescript-eslint/no-unused-vars': noUnusedVars,
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
    },
  },

  {
    name: 'taskrelay/tests-and-tools',
    files: TESTS_AND_TOOLS,
    rules: {
      // Tests reach into loosely typed JSON-RPC payloads; `any` and `!` there are a test's business.
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-non-null-assertion': 'off',
      // `z.ZodObject<{}>` and friends: `{}` as an empty shape is the zod idiom.
      '@typescript-eslint/no-empty-object-type': 'off',
    },
  },

  {
    name: 'taskrelay/src',
    files: SRC,
    extends: [tseslint.configs.recommendedTypeChecked],
    plugins: { 'import-x': importX },
    languageOptions: {
      parserOptions: {
        projectService: true,
        tsconfigRootDir: import.meta.dirname,
      },
    },
    settings: {
      'import-x/extensions': ['.ts', '.mts', '.cts', '.js', '.mjs', '.cjs'],
      'import-x/external-module-folders': ['node_modules', 'node_modules/@types'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts', '.mts', '.cts'] },
      'import-x/resolver-next': [
        createNodeResolver({
          // NodeNext sources import `./x.js` that is `./x.ts` on disk.
          extensionAlias: { '.js': ['.ts', '.js'], '.mjs': ['.mts', '.mjs'], '.cjs': ['.cts', '.cjs'] },
          extensions: ['.ts', '.mts', '.cts', '.js', '.mjs', '.cjs', '.json', '.node'],
          conditionNames: ['types', 'import', 'node', 'default'],
        }),
      ],
    },
    rules: {
      // Promises: the rules this codebase exists for.
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/return-await': ['error', 'in-try-catch'],
      '@typescript-eslint/promise-function-async': 'off',
      // `async` methods that satisfy a Promise-returning interface without awaiting are fine.
      '@typescript-eslint/require-await': 'off',

      // Type-only imports, inline style (`import { pino, type Logger }`), as verbatimModuleSyntax wants.
      '@typescript-eslint/consistent-type-imports': [
        'error',
        { prefer: 'type-imports', fixStyle: 'inline-type-imports', disallowTypeAnnotations: true },
      ],
      '@typescript-eslint/no-import-type-side-effects': 'error',
      '@typescript-eslint/consistent-type-exports': ['error', { fixMixedExportsWithInlineTypeSpecifier: true }],

      // Strictness, tuned to this codebase.
      '@typescript-eslint/restrict-template-expressions': [
        'error',
        { allowNumber: true, allowBoolean: true, allowNullish: false, allowAny: false, allowRegExp: false },
      ],
      '@typescript-eslint/no-unused-vars': noUnusedVars,
      '@typescript-eslint/only-throw-error': 'error',
      '@typescript-eslint/prefer-promise-reject-errors': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': [
        'error',
        { considerDefaultExhaustiveForUnions: true, requireDefaultForNonUnion: false },
      ],
      // `??` instead of `||` for defaults: flags numbers and objects (`port || 3000`); strings and booleans,
      // where an empty or false value falling back is usually what is meant, stay allowed.
      '@typescript-eslint/prefer-nullish-coalescing': [
        'error',
        {
          ignorePrimitives: { boolean: true, string: true },
          ignoreConditionalTests: true,
          ignoreMixedLogicalExpressions: true,
        },
      ],

      // Imports.
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
      'import-x/no-self-import': 'error',
      'import-x/no-duplicates': ['error', { 'prefer-inline': true }],
      'import-x/no-useless-path-segments': 'error',
      // Each package declares what it imports (its own package.json); type-only imports are exempt.
      'import-x/no-extraneous-dependencies': [
        'error',
        { devDependencies: false, optionalDependencies: false, peerDependencies: true },
      ],

      // JSON-RPC error numbers are named once (`JSON_RPC` in shared/src/protocol/errors.ts); a domain error's number comes from
      // the wire's code table (gateway/src/wire/errors.ts).
      'no-restricted-syntax': [
        'error',
        {
          selector: "UnaryExpression[operator='-'] > Literal[value>=32000][value<=32768]",
          message: 'Name the JSON-RPC error number: JSON_RPC.* from @taskrelay/shared (one list, PROTOCOL.md §16).',
        },
      ],

      // Libraries log through pino; only entry points may print (see the next block).
      'no-console': 'error',
      eqeqeq: ['error', 'always', { null: 'ignore' }],

      // A function is read whole: past 120 lines of code, extract its coherent steps (a run's phases, a start's
      // wiring stages, a command group) into functions of their own (issue 31).
      'max-lines-per-function': ['error', { max: 120, skipBlankLines: true, skipComments: true }],
    },
  },

  {
    name: 'taskrelay/json-rpc-numbers',
    files: ['packages/shared/src/protocol/errors.ts'],
    rules: { 'no-restricted-syntax': 'off' },
  },

  {
    name: 'taskrelay/entry-points',
    files: ENTRY_POINTS,
    rules: { 'no-console': 'off' },
  },

  // The architecture, enforced: gateway and worker meet only through @taskrelay/shared.
  {
    name: 'taskrelay/gateway-boundary',
    files: ['packages/gateway/src/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [GATEWAY_NO_WORKER],
        },
      ],
    },
  },
  // The gateway's layers (PROTOCOL.md §16): each folder imports only from the rows below its own, never from a peer.
  {
    name: 'taskrelay/gateway-layers',
    files: ['packages/gateway/src/**/*.ts'],
    rules: {
      'import-x/no-restricted-paths': ['error', { zones: gatewayLayerZones() }],
    },
  },
  // Below the wire there are task records and domain errors only: no MCP SDK wire type.
  {
    name: 'taskrelay/gateway-tasks-no-wire',
    files: ['packages/gateway/src/tasks/**/*.ts', 'packages/gateway/src/metrics/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            GATEWAY_NO_WORKER,
            {
              group: ['@modelcontextprotocol/sdk', '@modelcontextprotocol/sdk/*'],
              message:
                'tasks/ and metrics/ deal in task records and domain errors only; render for the wire in wire/ (PROTOCOL.md §16).',
            },
          ],
        },
      ],
    },
  },
  {
    name: 'taskrelay/worker-boundary',
    files: ['packages/worker/src/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['@taskrelay/gateway', '@taskrelay/gateway/*', '**/gateway/src/**'],
              message: 'The worker never imports gateway code; put shared vocabulary in @taskrelay/shared.',
            },
          ],
        },
      ],
    },
  },
  {
    name: 'taskrelay/shared-boundary',
    files: ['packages/shared/src/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['@taskrelay/gateway', '@taskrelay/worker', '@taskrelay/gateway/*', '@taskrelay/worker/*'],
              message: '@taskrelay/shared depends on neither the gateway nor the worker.',
            },
          ],
        },
      ],
    },
  },
  // The cross-language contract (issue 47, PROTOCOL.md §29.2) stands alone: what the manifest carries comes from this
  // folder only, so a key or shape cannot hide in a runtime module the emitter never reads.
  {
    name: 'taskrelay/shared-protocol',
    files: ['packages/shared/src/protocol/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              group: ['../*', '@taskrelay/*'],
              message: 'packages/shared/src/protocol/ imports only from itself (and libraries such as zod).',
            },
          ],
        },
      ],
    },
  },
);
