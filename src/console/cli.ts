// `gateway console token`: prints the operator console's token on its last line (docs/console.md) — the
// configured one (GATEWAY_CONSOLE_TOKEN) when set, else the one kept in the gateway's database (made on
// first use, the same one `gateway serve` reads).
import { EXIT_OK, EXIT_USAGE, type OperatorContext } from "../cli/operator.ts";
import { operatorToken } from "./auth.ts";
import { CONSOLE_TOKEN_SECRET } from "./index.ts";

const USAGE = ["usage: gateway console token [--data-dir DIR]"];

export async function runConsoleCommand(argv: readonly string[], ctx: OperatorContext): Promise<number> {
  if (argv[0] === "help" || argv[0] === "--help" || argv[0] === "-h") {
    USAGE.forEach((l) => ctx.stdout(l));
    return EXIT_OK;
  }
  if (argv[0] !== "token" || argv.length > 1) {
    ctx.stderr(argv[0] === undefined ? "error: missing subcommand" : `error: unknown argument ${argv[argv.length > 1 && argv[0] === "token" ? 1 : 0]}`);
    USAGE.forEach((l) => ctx.stderr(l));
    return EXIT_USAGE;
  }
  const configured = process.env.GATEWAY_CONSOLE_TOKEN;
  const token = await operatorToken(configured, () => ctx.store.getOrCreateSecret(CONSOLE_TOKEN_SECRET, 32));
  // Guidance on stderr, the token alone on stdout's last line (scripts read it with `tail -n 1`).
  ctx.stderr(configured ? "The console token configured by GATEWAY_CONSOLE_TOKEN:" : "The console token kept in this gateway's database:");
  ctx.stderr("Open /console and paste it, or send it as 'Authorization: Bearer TOKEN'. Keep it secret.");
  ctx.stdout(token);
  return EXIT_OK;
}
