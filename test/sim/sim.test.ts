// The deterministic whole-system simulation (docs/reliability.md): SIM_SEEDS seeds (.ci/run sets
// 1,000; a plain `bun test` runs 100, ~10 s, so that every landing's suite stays short), each the real
// gateway under randomly injected faults with the invariants checked after the run; a planted bug must
// be found, and a failing seed must replay the same trace.
import { describe, expect, test } from "bun:test";
import { runSeeds } from "./sim.ts";
import { runSeed } from "./world.ts";

const SEEDS = Number(process.env.SIM_SEEDS ?? "100");

describe("the whole-system simulation", () => {
  test(
    `${SEEDS} seeds under injected faults keep every invariant (I1–I5)`,
    async () => {
      const figures = await runSeeds(1, SEEDS);
      console.log(
        `sim: ${figures.seeds} seeds in ${figures.seconds.toFixed(1)} s, ${figures.requests} requests, ${figures.settlements} settlements, ${figures.checks} checks, faults ${JSON.stringify(Object.fromEntries(figures.faults.counts))}`,
      );
      expect(figures.failed.map((r) => ({ seed: r.seed, violations: r.violations }))).toEqual([]);
      // Every fault kind was injected somewhere in a batch of 100 or more.
      const kinds = ["buyer_abort", "clock_jump", "commit_fails", "gateway_crash", "provider_decline", "provider_disconnect", "provider_duplicate", "provider_forged"];
      kinds.push("provider_inflate", "provider_inflatedReceipt", "provider_late", "provider_never", "provider_stall", "provider_stallMid", "provider_swap", "provider_twice", "provider_wrongHash");
      if (SEEDS >= 100) for (const kind of kinds) expect(figures.faults.counts.get(kind) ?? 0).toBeGreaterThan(0);
    },
    120_000,
  );

  test("the same seed gives the same trace", async () => {
    for (const seed of [3, 17]) {
      const a = await runSeed({ seed });
      const b = await runSeed({ seed });
      expect(a.trace.length).toBeGreaterThan(10);
      expect(b.trace).toEqual(a.trace);
    }
  });

  for (const bug of ["double_charge", "leaked_slot"] as const) {
    test(`a planted ${bug} is found, and its failing seed replays the same trace`, async () => {
      let failing = null;
      for (let seed = 1; seed <= 50 && failing === null; seed++) {
        const result = await runSeed({ seed, plantedBug: bug });
        if (result.violations.length > 0) failing = result;
      }
      expect(failing).not.toBeNull();
      const expected = bug === "double_charge" ? /^I[13] / : /^I5 .*request slots/;
      expect(failing!.violations.some((v) => expected.test(v))).toBe(true);
      const replay = await runSeed({ seed: failing!.seed, plantedBug: bug });
      expect(replay.trace).toEqual(failing!.trace);
      expect(replay.violations).toEqual(failing!.violations);
    });
  }

  test("regression: a gateway stopped while a stream's end waits for its commit closes its store before the replay file", async () => {
    // Found by this simulation (seeds 100288, 100396): a crash's stop() closed the replay file, then the
    // store, whose closing commit ran the stream's end, which wrote to the closed replay file and threw
    // out of stop() — the store was left open.
    for (const seed of [100288, 100396]) expect((await runSeed({ seed })).violations).toEqual([]);
  });

  test("regression: without the fail-stop a failed commit leaves attempts pending and reservations held", async () => {
    // Found by this simulation: a failed group commit that held a settlement left its attempt pending
    // with no actor to settle it. The first seed showing it without the fail-stop must be clean with it.
    let found = null;
    for (let seed = 1; seed <= 300 && found === null; seed++) {
      const before = await runSeed({ seed, failStop: false });
      if (before.violations.some((v) => v.startsWith("I2 ") && v.endsWith("is still pending"))) found = seed;
    }
    expect(found).not.toBeNull();
    const after = await runSeed({ seed: found! });
    expect(after.violations).toEqual([]);
  }, 60_000);
});
