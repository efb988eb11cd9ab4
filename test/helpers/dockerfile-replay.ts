/**
 * Replays a Dockerfile without a container engine (none runs here or in CI, and there is no image registry): each
 * stage gets a root directory in a scratch tree, `COPY` copies the same files (the build context filtered by
 * .dockerignore, or another stage's root for `--from`), `RUN` runs the same shell command in the stage's `WORKDIR`
 * with its `ARG`s and `ENV`, and the final stage's root is the image's file system. What differs from a real build,
 * on purpose:
 * - a stage `FROM` an outside image starts empty, and the host's Node stands for the image's;
 * - absolute paths in a `RUN` command are taken inside the stage's root (`/app` is `<root>/app`), and
 *   `npm install -g` installs under `<root>/usr/local`, whose `bin` comes first on `PATH`;
 * - pnpm's content-addressed store is the host's, so an install downloads only what the host has never fetched;
 * - the network settings (CA bundle, proxies, npm's global config) are the host's, as a build daemon's would be;
 * - `USER`, `EXPOSE`, `STOPSIGNAL` and `--chown` change nothing here (the test runs as whoever runs it).
 * Any other instruction (`ADD`, `RUN --mount`, heredocs, ...) throws, so a Dockerfile change the replay cannot follow
 * fails the test instead of passing untested.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { basename, dirname, join, relative, resolve } from 'node:path';
import dockerignore from '@balena/dockerignore';
import { DockerfileParser, type Arg, type Copy, type Env, type From, type Instruction } from 'dockerfile-ast';

export type Step =
  | { kind: 'arg'; name: string; value?: string }
  | { kind: 'env'; vars: Record<string, string> }
  | { kind: 'workdir'; path: string }
  | { kind: 'copy'; from?: string; sources: string[]; dest: string }
  | { kind: 'run'; command: string }
  | { kind: 'cmd'; argv: string[] };

export interface Stage {
  name: string;
  /** The image or earlier stage it starts from, with global `ARG`s expanded. */
  from: string;
  steps: Step[];
}

export interface ParsedDockerfile {
  /** Global `ARG`s (before the first `FROM`) with their defaults. */
  args: Record<string, string>;
  stages: Stage[];
}

/** CommonJS (`module.exports = factory`): under ESM the default import is the factory, whatever its types say. */
const ignore = ((dockerignore as { default?: unknown }).default ?? dockerignore) as typeof dockerignore.default;

/** Instructions that change nothing in a replay (see the module comment). */
const NO_OP = new Set(['USER', 'EXPOSE', 'STOPSIGNAL', 'LABEL', 'HEALTHCHECK']);

function expand(text: string, vars: Record<string, string>): string {
  return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a?: string, b?: string) => vars[a ?? b ?? ''] ?? '');
}

export function parseDockerfile(text: string): ParsedDockerfile {
  const args: Record<string, string> = {};
  const stages: Stage[] = [];
  for (const instruction of DockerfileParser.parse(text).getInstructions()) {
    const keyword = instruction.getKeyword();
    const stage = stages.at(-1);
    if (keyword === 'FROM') {
      const from = instruction as From;
      const image = expand(from.getImageName() ?? '', args);
      const tag = from.getImageTag();
      stages.push({
        name: from.getBuildStage() ?? String(stages.length),
        from: tag ? `${image}:${expand(tag, args)}` : expand(from.getArguments()[0]?.getValue() ?? '', args),
        steps: [],
      });
      continue;
    }
    if (keyword === 'ARG') {
      const property = (instruction as Arg).getProperty();
      const name = property?.getName() ?? '';
      const value = property?.getUnescapedValue() ?? undefined;
      if (!stage) args[name] = value ?? '';
      else stage.steps.push({ kind: 'arg', name, ...(value !== undefined ? { value } : {}) });
      continue;
    }
    if (!stage) throw new Error(`Dockerfile: ${keyword} before the first FROM`);
    if (NO_OP.has(keyword)) continue;
    stage.steps.push(parseStep(instruction, keyword));
  }
  return { args, stages };
}

function parseStep(instruction: Instruction, keyword: string): Step {
  const line = instruction.getRange().start.line + 1;
  const unsupported = () =>
    new Error(`Dockerfile line ${line}: the replay cannot follow ${instruction.getTextContent()}`);
  switch (keyword) {
    case 'ENV': {
      const vars: Record<string, string> = {};
      for (const p of (instruction as Env).getProperties()) vars[p.getName()] = p.getUnescapedValue() ?? '';
      return { kind: 'env', vars };
    }
    case 'WORKDIR':
      return { kind: 'workdir', path: instruction.getArgumentsContent() ?? '/' };
    case 'COPY': {
      const copy = instruction as Copy;
      let from: string | undefined;
      for (const flag of copy.getFlags()) {
        if (flag.getName() === 'from') from = flag.getValue() ?? undefined;
        else if (flag.getName() !== 'chown' && flag.getName() !== 'chmod') throw unsupported();
      }
      const paths = copy.getArguments().map((a) => a.getValue());
      const dest = paths.pop();
      if (!dest || paths.length === 0 || copy.getHeredocs().length > 0) throw unsupported();
      return { kind: 'copy', ...(from !== undefined ? { from } : {}), sources: paths, dest };
    }
    case 'RUN': {
      const content = instruction.getArgumentsContent() ?? '';
      if (content.startsWith('[') || content.startsWith('--') || content.includes('<<')) throw unsupported();
      return { kind: 'run', command: content };
    }
    case 'CMD': {
      const content = instruction.getArgumentsContent() ?? '';
      if (!content.startsWith('[')) throw unsupported();
      return { kind: 'cmd', argv: JSON.parse(content) as string[] };
    }
    default:
      throw unsupported();
  }
}

/** The paths (relative to the context, `/`-separated) every `COPY` from the build context names. */
export function contextSources(parsed: ParsedDockerfile): string[] {
  return parsed.stages.flatMap((s) =>
    s.steps.flatMap((step) => (step.kind === 'copy' && step.from === undefined ? step.sources : [])),
  );
}

export interface ReplayOptions {
  /** The build context (the repository root). */
  context: string;
  /** An empty directory the stages' roots go into. */
  scratch: string;
  /** The Dockerfile, relative to the context (`docker build -f`). Default `Dockerfile`. */
  dockerfile?: string;
  /** Build args (`--build-arg`), overriding the Dockerfile's defaults. */
  buildArgs?: Record<string, string>;
  /**
   * npm's cache for the `RUN`s (default: a fresh one in `scratch`); the host's makes an `npm install` warm. Only for
   * a Dockerfile that never runs `npm cache clean` (it would empty that cache).
   */
  npmCache?: string;
  /** Called with each step as it starts, for the test's log. */
  onStep?: (stage: string, step: Step) => void;
}

export interface ReplayedImage {
  /** The final stage's root: the image's file system. */
  root: string;
  /** Its `WORKDIR`, inside `root`. */
  workdir: string;
  /** Its `ENV`. */
  env: Record<string, string>;
  cmd: string[];
}

interface StageState {
  root: string;
  workdir: string;
  env: Record<string, string>;
  args: Record<string, string>;
  cmd: string[];
}

export function replayDockerfile(options: ReplayOptions): ReplayedImage {
  const context = resolve(options.context);
  const parsed = parseDockerfile(readFileSync(join(context, options.dockerfile ?? 'Dockerfile'), 'utf8'));
  const globalArgs = { ...parsed.args, ...options.buildArgs };
  const dockerignore = join(context, '.dockerignore');
  const ignored = ignore().add(existsSync(dockerignore) ? readFileSync(dockerignore, 'utf8') : '');
  const home = join(options.scratch, 'home');
  mkdirSync(home, { recursive: true });
  const store = spawnSync('pnpm', ['store', 'path'], { cwd: context, encoding: 'utf8' }).stdout.trim();
  // The builder's network, as a build daemon has it: CA bundle, proxies and npm's global config (registry, cafile);
  // nothing else of this process's environment reaches a RUN.
  const network = Object.fromEntries(
    Object.entries(process.env).filter(
      (e): e is [string, string] =>
        e[1] !== undefined && /^(node_extra_ca_certs|ssl_cert_file|ssl_cert_dir|https?_proxy|no_proxy)$/i.test(e[0]),
    ),
  );
  const npmGlobalConfig = spawnSync('npm', ['config', 'get', 'globalconfig'], { encoding: 'utf8' }).stdout.trim();
  const done = new Map<string, StageState>();

  let last: StageState | undefined;
  for (const stage of parsed.stages) {
    const root = join(options.scratch, 'stages', stage.name);
    const base = done.get(stage.from);
    let state: StageState;
    if (base) {
      cpSync(base.root, root, { recursive: true, verbatimSymlinks: true });
      state = { ...base, root, env: { ...base.env }, args: {} };
    } else {
      mkdirSync(root, { recursive: true });
      state = { root, workdir: '/', env: {}, args: {}, cmd: [] };
    }
    const inRoot = (path: string) => join(root, path);
    for (const step of stage.steps) {
      options.onStep?.(stage.name, step);
      switch (step.kind) {
        case 'arg':
          state.args[step.name] = globalArgs[step.name] ?? step.value ?? '';
          break;
        case 'env':
          Object.assign(state.env, step.vars);
          break;
        case 'workdir':
          state.workdir = resolve(state.workdir, step.path);
          mkdirSync(inRoot(state.workdir), { recursive: true });
          break;
        case 'cmd':
          state.cmd = step.argv;
          break;
        case 'copy': {
          const source = step.from === undefined ? undefined : done.get(step.from);
          if (step.from !== undefined && !source) throw new Error(`COPY --from=${step.from}: no such stage before`);
          const destDir = step.dest.endsWith('/') || step.sources.length > 1;
          const dest = inRoot(resolve(state.workdir, step.dest));
          const base = source ? source.root : context;
          // A `*` in a source's last segment matches as Docker's does; a COPY none of whose sources matches fails.
          const sources = step.sources.flatMap((src) => (src.includes('*') ? expandGlob(base, src) : [src]));
          if (sources.length === 0) throw new Error(`COPY ${step.sources.join(' ')}: no source file matches`);
          for (const src of sources) {
            const from = join(base, src);
            if (!existsSync(from)) throw new Error(`COPY ${src}: not found in ${source ? step.from : 'the context'}`);
            const target = destDir && !statSync(from).isDirectory() ? join(dest, basename(src)) : dest;
            mkdirSync(dirname(target), { recursive: true });
            cpSync(from, target, {
              recursive: true,
              verbatimSymlinks: true,
              filter: (path) => {
                if (source) return true;
                const rel = relative(context, path).split('\\').join('/');
                return rel === '' || !ignored.ignores(rel);
              },
            });
          }
          break;
        }
        case 'run': {
          // Absolute paths at a word's start are the image's: re-rooted into this stage's root.
          const command = step.command.replace(/(^|[\s"'=(])\/(?=[\w.@-])/g, `$1${root}/`);
          const ran = spawnSync('sh', ['-c', command], {
            cwd: inRoot(state.workdir),
            encoding: 'utf8',
            env: {
              PATH: [join(root, 'usr/local/bin'), dirname(process.execPath), '/usr/local/bin', '/usr/bin', '/bin'].join(
                ':',
              ),
              ...network,
              HOME: home,
              ...(npmGlobalConfig ? { npm_config_globalconfig: npmGlobalConfig } : {}),
              npm_config_prefix: join(root, 'usr/local'),
              npm_config_cache: options.npmCache ?? join(options.scratch, 'npm-cache'),
              npm_config_update_notifier: 'false',
              pnpm_config_store_dir: store.replace(/\/v\d+$/, ''),
              ...state.args,
              ...state.env,
            },
            maxBuffer: 64 * 1024 * 1024,
          });
          if (ran.status !== 0) {
            throw new Error(
              `RUN ${step.command} (stage ${stage.name}) exited ${ran.status ?? ran.signal}:\n${ran.stdout}${ran.stderr}`,
            );
          }
          break;
        }
      }
    }
    done.set(stage.name, state);
    last = state;
  }
  if (!last) throw new Error('Dockerfile: no FROM');
  return { root: last.root, workdir: inRoot(last.root, last.workdir), env: last.env, cmd: last.cmd };
}

/** The entries of `base` that `pattern` (a `*` wildcard in its last segment only) names, relative to `base`. */
function expandGlob(base: string, pattern: string): string[] {
  const dir = dirname(pattern);
  if (dir.includes('*')) throw new Error(`COPY ${pattern}: the replay matches a wildcard in the last segment only`);
  const escaped = basename(pattern).replace(/[.+?^${}()|[\]\\]/g, '\\$&');
  const matcher = new RegExp(`^${escaped.replace(/\*/g, '.*')}$`);
  const within = join(base, dir);
  if (!existsSync(within)) return [];
  return readdirSync(within)
    .filter((name) => matcher.test(name))
    .sort()
    .map((name) => (dir === '.' ? name : `${dir}/${name}`));
}

function inRoot(root: string, path: string): string {
  return join(root, path);
}
