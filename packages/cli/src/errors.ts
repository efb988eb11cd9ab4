/** Exit codes of `taskrelay` (docs/CLI.md) and the error that maps to a usage error. */
export const EXIT = {
  /** The call completed (and the tool did not return `isError`); any other command succeeded. */
  ok: 0,
  /** The call failed or the tool returned `isError`; or the gateway answered with an error. */
  failed: 1,
  /** Bad command line: unknown command or option, malformed `key=value`. */
  usage: 2,
  /** Interrupted: the calls were cancelled (Ctrl-C) or ended `cancelled`. */
  cancelled: 130,
} as const;

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** A command-line mistake: printed as one line, exit code 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** The worst of several outcomes: cancelled beats failed beats ok. */
export function worstExit(codes: readonly ExitCode[]): ExitCode {
  if (codes.includes(EXIT.cancelled)) return EXIT.cancelled;
  if (codes.includes(EXIT.failed)) return EXIT.failed;
  return EXIT.ok;
}
