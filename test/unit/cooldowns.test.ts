// Property tests of the cooldown rules (src/gateway/cooldowns.ts, docs/routing.md): random sequences of
// failures, dispatches, successes and cancels at random times, checked against the rules.
import { expect, test } from "bun:test";
import fc from "fast-check";
import {
  afterDispatch,
  afterFailure,
  afterNoVerdict,
  afterSuccess,
  cooldownMs,
  Cooldowns,
  healthOf,
  type CooldownEntry,
  type CooldownRules,
} from "../../src/gateway/cooldowns.ts";

const rulesArb = fc
  .record({ baseMs: fc.integer({ min: 1, max: 10_000 }), factor: fc.integer({ min: 1, max: 200 }), trialTimeoutMs: fc.integer({ min: 1, max: 100_000 }) })
  .map(({ baseMs, factor, trialTimeoutMs }): CooldownRules => ({ baseMs, maxMs: baseMs * factor, trialTimeoutMs }));

type Op = { kind: "fail" | "dispatch" | "success" | "cancel"; dt: number };
const opsArb = fc.array(
  fc.record({ kind: fc.constantFrom<Op["kind"]>("fail", "dispatch", "success", "cancel"), dt: fc.integer({ min: 0, max: 400_000 }) }),
  { maxLength: 60 },
);

test("backoff doubles from base, never exceeds max, and never shrinks with the level", () => {
  fc.assert(
    fc.property(rulesArb, fc.integer({ min: 1, max: 80 }), (rules, level) => {
      const d = cooldownMs(rules, level);
      expect(d).toBeLessThanOrEqual(rules.maxMs);
      expect(d).toBeGreaterThanOrEqual(Math.min(rules.baseMs, rules.maxMs));
      expect(cooldownMs(rules, level + 1)).toBeGreaterThanOrEqual(d);
      if (rules.baseMs * 2 ** level <= rules.maxMs) expect(cooldownMs(rules, level + 1)).toBe(2 * d);
      expect(cooldownMs(rules, 1)).toBe(Math.min(rules.baseMs, rules.maxMs));
    }),
  );
});

test("any sequence of outcomes obeys the rules", () => {
  fc.assert(
    fc.property(rulesArb, opsArb, (rules, ops) => {
      let entry: CooldownEntry | undefined;
      let now = 0;
      let failuresSinceSuccess = 0;
      for (const op of ops) {
        now += op.dt;
        const before = healthOf(entry, now, rules);
        switch (op.kind) {
          case "fail": {
            entry = afterFailure(entry, now, rules, "provider_error");
            failuresSinceSuccess++;
            // A failure always cools, one level up, for exactly the backoff of that level.
            expect(entry.level).toBe(failuresSinceSuccess);
            expect(entry.until - now).toBe(cooldownMs(rules, failuresSinceSuccess));
            expect(healthOf(entry, now, rules)).toBe(cooldownMs(rules, failuresSinceSuccess) > 0 ? "cooling" : "half_open");
            break;
          }
          case "dispatch": {
            const next = afterDispatch(entry, now, rules);
            // Only a half-open pair starts a trial; a trial blocks a second one until it times out.
            if (before === "half_open") expect(healthOf(next, now, rules)).toBe(rules.trialTimeoutMs > 0 ? "trial" : "half_open");
            else expect(next).toBe(entry);
            entry = next;
            break;
          }
          case "success":
            entry = afterSuccess(entry);
            failuresSinceSuccess = 0;
            expect(healthOf(entry, now, rules)).toBe("healthy");
            break;
          case "cancel": {
            const next = afterNoVerdict(entry);
            // No verdict never changes the level or the cooldown, and reopens a running trial.
            expect(next?.level).toBe(entry?.level);
            expect(next?.until).toBe(entry?.until);
            if (before === "trial") expect(healthOf(next, now, rules)).toBe("half_open");
            entry = next;
            break;
          }
        }
        // Health is a function of the entry and time: healthy iff no failure since the last success.
        expect(healthOf(entry, now, rules) === "healthy").toBe(failuresSinceSuccess === 0);
        // Once the cooldown and any trial are over, the pair is routable again (half-open).
        if (entry) expect(healthOf(entry, Math.max(entry.until, (entry.trialSince ?? 0) + rules.trialTimeoutMs), rules)).toBe("half_open");
      }
    }),
  );
});

test("the live table: per (provider, model), reported transitions, recent failures by pair", () => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ p: fc.constantFrom("a", "b"), m: fc.constantFrom("m1", "m2"), fail: fc.boolean(), dt: fc.integer({ min: 0, max: 20_000 }) }), { maxLength: 40 }),
      (steps) => {
        let now = 0;
        const changes: string[] = [];
        const table = new Cooldowns({ baseMs: 5_000, maxMs: 300_000, trialTimeoutMs: 60_000 }, () => now, (c) => changes.push(c.event), 600_000);
        const model = new Map<string, CooldownEntry | undefined>();
        const failTimes: Record<string, number[]> = { "a/m1": [], "a/m2": [], "b/m1": [], "b/m2": [] };
        for (const s of steps) {
          now += s.dt;
          const key = `${s.p}/${s.m}`;
          const before = changes.length;
          if (s.fail) {
            table.failed(s.p, s.m, "lost_socket");
            model.set(key, afterFailure(model.get(key), now, table.rules, "lost_socket"));
            failTimes[key]!.push(now);
            expect(changes.slice(before)).toEqual(["cooled"]);
          } else {
            const had = model.get(key) !== undefined;
            table.succeeded(s.p, s.m);
            model.set(key, undefined);
            expect(changes.slice(before)).toEqual(had ? ["reset"] : []);
          }
          for (const p of ["a", "b"]) {
            for (const m of ["m1", "m2"]) {
              expect(table.health(p, m)).toBe(healthOf(model.get(`${p}/${m}`), now, table.rules));
              expect(table.recentFailures(p, m)).toBe(failTimes[`${p}/${m}`]!.filter((t) => t >= now - 600_000).length);
            }
          }
        }
      },
    ),
  );
});
