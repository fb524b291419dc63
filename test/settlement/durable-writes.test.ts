// Settlement writes tried until they land (src/gateway/settlement/durableWrites.ts), except one the
// store refused because another cluster node adopted the attempt (docs/scale-out.md, "Fencing"):
// nothing of it is this node's to write any more, so it is neither retried nor lost in the log.
import { expect, test } from "bun:test";
import { durableWrites } from "../../src/gateway/settlement/durableWrites.ts";
import type { Log } from "../../src/log.ts";

function recordingLog(): Log & { lines: [string, string, Record<string, unknown> | undefined][] } {
  const lines: [string, string, Record<string, unknown> | undefined][] = [];
  const at = (level: string) => (event: string, fields?: Record<string, unknown>) => void lines.push([level, event, fields]);
  return { lines, debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

test("a write refused as adopted elsewhere is tried once, told, and given up; an unreachable store is waited out", async () => {
  const log = recordingLog();
  const told: unknown[] = [];
  const writes = durableWrites(log, async () => {}, (ids) => told.push(ids));

  let tries = 0;
  const refused = await writes.run("settlement", { request_id: "r-1", attempt_n: 0 }, async () => {
    tries++;
    throw Object.assign(new Error("attempt r-1#0 was adopted by another node"), { errno: "GWF01" });
  });
  expect(refused).toBeNull();
  expect(tries).toBe(1);
  expect(told).toEqual([{ request_id: "r-1", attempt_n: 0 }]);
  expect(log.lines).toEqual([["warn", "settlement_write_refused", { request_id: "r-1", attempt_n: 0, write: "settlement", reason: "adopted_elsewhere" }]]);

  // Unreachable twice, then it lands: tried until it does, and nobody is told of an adoption.
  let down = 2;
  const landed = await writes.run("attempt_end", { request_id: "r-2", attempt_n: 0 }, async () => {
    if (down-- > 0) throw Object.assign(new Error("connection closed"), { code: "ERR_POSTGRES_CONNECTION_CLOSED" });
    return true;
  });
  expect(landed).toBe(true);
  expect(told).toHaveLength(1);
});
