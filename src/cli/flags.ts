// A small command-line flag parser shared by the operator commands and the gateway's config module.
// Forms: `--name value`, `--name=value`, boolean `--flag`, repeated flags (when declared `multiple`),
// positionals, and `--` to end flags. Expected failures come back as values, never exceptions.

/**
 * `string`: needs a value. `boolean`: no value (`--flag=true|false` also accepted).
 * `string-or-true`: a bare `--flag` gives `true`, `--flag=value` gives the value; a separate next
 * argument is never taken as its value (so `--inspect serve` stays unambiguous).
 */
export type FlagKind = "string" | "boolean" | "string-or-true";

export interface FlagDef {
  kind: FlagKind;
  /** May be given more than once; values are collected in order. Otherwise a repeat is an error. */
  multiple?: boolean;
}

export type FlagSpec = Record<string, FlagDef>;

type One<D extends FlagDef> = D["kind"] extends "string" ? string : D["kind"] extends "boolean" ? boolean : string | true;

export type FlagValue<D extends FlagDef> = D["kind"] extends "boolean"
  ? boolean
  : D["multiple"] extends true
    ? One<D>[]
    : One<D> | undefined;

export type ParsedFlags<S extends FlagSpec> = { [K in keyof S]: FlagValue<S[K]> };

export type FlagErrorCode = "unknown_flag" | "missing_value" | "unexpected_value" | "repeated_flag";

export type ParseResult<S extends FlagSpec> =
  | { ok: true; flags: ParsedFlags<S>; positionals: string[] }
  | { ok: false; code: FlagErrorCode; flag: string; message: string };

/** Parses `argv` (without the program and subcommand words) against `spec`. */
export function parseFlags<const S extends FlagSpec>(argv: readonly string[], spec: S): ParseResult<S> {
  const values = new Map<string, (string | boolean)[]>();
  const positionals: string[] = [];
  const fail = (code: FlagErrorCode, flag: string, message: string) => ({ ok: false as const, code, flag, message });

  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    // A lone "-" is a positional by convention (standard input).
    if (!arg.startsWith("-") || arg === "-") {
      positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf("=");
    const name = arg.startsWith("--") ? arg.slice(2, eq === -1 ? undefined : eq) : "";
    const def = Object.hasOwn(spec, name) ? spec[name] : undefined;
    if (def === undefined) return fail("unknown_flag", arg, `unknown flag ${eq === -1 ? arg : arg.slice(0, eq)}`);
    const inline = eq === -1 ? undefined : arg.slice(eq + 1);

    let value: string | boolean;
    if (def.kind === "boolean") {
      if (inline === undefined) value = true;
      else if (inline === "true" || inline === "false") value = inline === "true";
      else return fail("unexpected_value", name, `flag --${name} takes no value (or =true/=false)`);
    } else if (inline !== undefined) {
      value = inline;
    } else if (def.kind === "string-or-true") {
      value = true;
    } else {
      const next = argv[i + 1];
      // A following flag means the value was forgotten; `--name=--x` still passes such a value.
      if (next === undefined || (next.startsWith("--") && next.length > 2)) {
        return fail("missing_value", name, `flag --${name} needs a value`);
      }
      value = next;
      i++;
    }

    const seen = values.get(name);
    if (seen !== undefined && def.multiple !== true) {
      return fail("repeated_flag", name, `flag --${name} given more than once`);
    }
    values.set(name, [...(seen ?? []), value]);
  }

  const flags: Record<string, unknown> = {};
  for (const [name, def] of Object.entries(spec)) {
    const given = values.get(name);
    if (def.kind === "boolean") flags[name] = given?.at(-1) ?? false;
    else if (def.multiple === true) flags[name] = given ?? [];
    else flags[name] = given?.[0];
  }
  return { ok: true, flags: flags as ParsedFlags<S>, positionals };
}
