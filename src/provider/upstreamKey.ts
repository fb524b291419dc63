// Where the openai engine's upstream key comes from (docs/openai-engine.md): `--upstream-key-file F`,
// else GATEWAY_UPSTREAM_KEY, else `--upstream-key KEY`, the least safe (other local users see it in ps).
import { readFileSync, statSync } from "node:fs";

export const UPSTREAM_KEY_ENV = "GATEWAY_UPSTREAM_KEY";

export type UpstreamKeyResult =
  | { ok: true; key: string | undefined; source: "file" | "env" | "flag" | "none"; insecureFile: boolean }
  | { ok: false; usage: boolean; message: string };

/**
 * The key from at most one of the flag and the file (both given is a usage error), or the environment.
 * The file's content is trimmed of surrounding whitespace (a trailing newline is usual); an empty or
 * unreadable file is an error rather than running without a key.
 */
export function resolveUpstreamKey(
  flag: string | undefined,
  file: string | undefined,
  env: Record<string, string | undefined>,
): UpstreamKeyResult {
  if (flag !== undefined && file !== undefined) {
    return { ok: false, usage: true, message: "give --upstream-key or --upstream-key-file, not both" };
  }
  if (file !== undefined) {
    let text: string;
    let mode: number;
    try {
      text = readFileSync(file, "utf8");
      mode = statSync(file).mode;
    } catch (error) {
      return { ok: false, usage: false, message: `cannot read --upstream-key-file ${file}: ${(error as NodeJS.ErrnoException).code ?? "error"}` };
    }
    const key = text.trim();
    if (key === "") return { ok: false, usage: false, message: `--upstream-key-file ${file} is empty` };
    return { ok: true, key, source: "file", insecureFile: (mode & 0o077) !== 0 };
  }
  if (flag !== undefined) return { ok: true, key: flag, source: "flag", insecureFile: false };
  const fromEnv = env[UPSTREAM_KEY_ENV];
  if (fromEnv !== undefined && fromEnv !== "") return { ok: true, key: fromEnv, source: "env", insecureFile: false };
  return { ok: true, key: undefined, source: "none", insecureFile: false };
}
