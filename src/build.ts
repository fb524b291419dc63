// `bun run build` / `bun run build:release`: the operator's single binary (docs/operator.md), via `bun build
// --compile`. Not part of the gateway itself — a build tool, so it may read and write the source tree.
//
//   bun src/build.ts                      → dist/gateway                  (this machine)
//   bun src/build.ts --release            → dist/gateway-{linux-x64,linux-arm64,darwin-arm64}
//   bun src/build.ts --release --runtime-from-npm   (skip Bun's own download, see below)
//
// A cross-compiled file needs the Bun runtime of the target platform. Bun downloads it by itself (from
// the npm registry, as the @oven/bun-* packages) and caches it under ~/.bun/install/cache. When that
// fails — or with --runtime-from-npm — this script fetches the same package with `npm pack` into
// dist/.runtimes/ and hands its `bin/bun` to Bun as the executable path, so a release build works
// wherever the npm registry (or a mirror npm is configured for) is reachable.
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { checkMachoAdhocSignature } from "./build-macho.ts";

interface Target {
  /** Suffix of the release file name: dist/gateway-<name>. */
  name: string;
  bunTarget: Bun.Build.CompileTarget;
  /** The npm package that ships this platform's Bun runtime. */
  npmPackage: string;
}

const RELEASE_TARGETS: readonly Target[] = [
  { name: "linux-x64", bunTarget: "bun-linux-x64", npmPackage: "@oven/bun-linux-x64" },
  { name: "linux-arm64", bunTarget: "bun-linux-arm64", npmPackage: "@oven/bun-linux-aarch64" },
  { name: "darwin-arm64", bunTarget: "bun-darwin-arm64", npmPackage: "@oven/bun-darwin-aarch64" },
];

const ROOT = join(import.meta.dir, "..");
const ENTRY = join(ROOT, "src/main.ts");
// Worker threads the gateway starts by URL (src/receipts/judge.ts): bundled into the binary beside it.
const WORKER_ENTRIES = [join(ROOT, "src/receipts/judgeWorker.ts")];
const DIST = join(ROOT, "dist");
const RUNTIMES = join(DIST, ".runtimes");

/** Bundles once without compiling, so a source error is reported as one and never blamed on a runtime download. */
export async function checkBundles(): Promise<void> {
  const result = await Bun.build({ entrypoints: [ENTRY, ...WORKER_ENTRIES], target: "bun" });
  if (!result.success) throw new AggregateError(result.logs, "the gateway's sources do not bundle");
}

/** Compiles src/main.ts into one executable at `outfile` (for this machine unless `target` is given). */
export async function compile(outfile: string, target?: Target, executablePath?: string): Promise<void> {
  const result = await Bun.build({
    entrypoints: [ENTRY, ...WORKER_ENTRIES],
    // msgpackr's optional native decoder is a .node addon that the bundle would load by its absolute
    // path in *this* checkout's node_modules; left external, the binary's require fails and msgpackr
    // uses its pure-JS decoder — the same behaviour on every machine, with nothing read from the tree.
    external: ["msgpackr-extract"],
    compile: {
      outfile,
      ...(target ? { target: target.bunTarget } : {}),
      ...(executablePath ? { executablePath } : {}),
      // An operator binary must behave the same in every working directory: a stray .env would change
      // settings silently, and a bunfig.toml could preload arbitrary code into the gateway.
      autoloadDotenv: false,
      autoloadBunfig: false,
    },
  });
  if (!result.success) throw new AggregateError(result.logs, `bun build --compile failed for ${outfile}`);
}

async function run(cmd: string[], cwd: string): Promise<string> {
  const proc = Bun.spawn(cmd, { cwd, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) throw new Error(`${cmd.join(" ")} exited ${code}: ${err.trim()}`);
  return out;
}

/** The target's Bun runtime at this Bun's exact version, fetched once with `npm pack` and unpacked. */
async function runtimeFromNpm(target: Target): Promise<string> {
  const dir = join(RUNTIMES, `${target.name}-v${Bun.version}`);
  const bin = join(dir, "package", "bin", "bun");
  if (existsSync(bin)) return bin;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  // The runtime must match the bundler's version: the embedded module graph format is version-specific.
  const spec = `${target.npmPackage}@${Bun.version}`;
  const packed = JSON.parse(await run(["npm", "pack", spec, "--json", "--pack-destination", dir], dir)) as Array<{ filename: string }>;
  await run(["tar", "-xzf", join(dir, packed[0]!.filename), "-C", dir], dir);
  if (!existsSync(bin)) throw new Error(`${spec} holds no package/bin/bun`);
  return bin;
}

async function buildRelease(forceNpm: boolean): Promise<string[]> {
  const outputs: string[] = [];
  for (const target of RELEASE_TARGETS) {
    const outfile = join(DIST, `gateway-${target.name}`);
    // The host's own target needs no download: Bun copies the running executable.
    const isHost = `${process.platform}-${process.arch}` === target.name;
    if (forceNpm && !isHost) {
      await compile(outfile, target, await runtimeFromNpm(target));
    } else {
      try {
        await compile(outfile, target);
      } catch (error) {
        const detail = ((error as AggregateError).errors ?? []).map(String).join("; ") || (error as Error).message;
        console.error(`build: Bun could not fetch the ${target.name} runtime (${detail}); trying npm pack`);
        await compile(outfile, target, await runtimeFromNpm(target));
      }
    }
    if (target.name.startsWith("darwin")) {
      const check = checkMachoAdhocSignature(new Uint8Array(await Bun.file(outfile).arrayBuffer()));
      if (!check.ok) throw new Error(`${outfile}: the ad-hoc code signature is broken (${check.reason}); macOS would kill it at launch`);
    }
    outputs.push(outfile);
  }
  return outputs;
}

async function main(argv: string[]): Promise<number> {
  const unknown = argv.find((a) => a !== "--release" && a !== "--runtime-from-npm");
  if (unknown) {
    console.error(`build: unknown option ${unknown}\nusage: bun src/build.ts [--release [--runtime-from-npm]]`);
    return 64;
  }
  mkdirSync(DIST, { recursive: true });
  try {
    await checkBundles();
  } catch (error) {
    for (const log of (error as AggregateError).errors ?? []) console.error(String(log));
    console.error(`build: ${(error as Error).message}`);
    return 1;
  }
  const outputs = argv.includes("--release")
    ? await buildRelease(argv.includes("--runtime-from-npm"))
    : (await compile(join(DIST, "gateway")), [join(DIST, "gateway")]);
  for (const file of outputs) console.log(file);
  return 0;
}

if (import.meta.main) process.exit(await main(process.argv.slice(2)));
