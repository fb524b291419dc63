// The output-token bound counts delivered tool-call bytes (docs/receipts.md). An attempt still pending
// when the gateway restarts is judged from its stored delivered record, so that record keeps the
// tool-call bytes: after the restart the bound is the one the attempt had before, on both backends.
// (A row written before the bytes were kept has none, and is bounded as before: by chunk tokens only.)
import { expect, test } from "bun:test";
import { recoverPending, type ResumedAttempt } from "../../src/gateway/settlement/recovery.ts";
import { deliveredOutputBound } from "../../src/receipts/verify.ts";
import type { DeliveredRecord } from "../../src/store/index.ts";
import { eachBackend } from "../store/backends.ts";
import { attempt } from "./attempt-fixture.ts";

const delivered = (tool_call_bytes: number | null): DeliveredRecord => ({
  output_hash: "3".repeat(64),
  start_byte: 0,
  end_byte: 5,
  tokens: 9,
  terminal_state: "normal_done",
  finish_reason: "tool_calls",
  tool_calls_delivered: true,
  tool_call_bytes,
  reported_input_tokens: 12,
});

eachBackend((b) => {
  test("a pending attempt resumed after a restart keeps its delivered tool-call bytes", async () => {
    const { store } = await b.fresh({ now: () => 1_000 });
    await store.recordRouteSnapshot(attempt("r-tools"));
    await store.recordAttemptEnd("r-tools", 0, delivered(40), 60_000);
    await store.recordRouteSnapshot(attempt("r-old"));
    await store.recordAttemptEnd("r-old", 0, delivered(null), 60_000);

    const resumed = new Map<string, ResumedAttempt>();
    const counts = await recoverPending(store, () => 2_000, (att) => resumed.set(att.requestId, att));
    expect(counts).toEqual({ resumed: 2, interrupted: 0 });
    // 5 content bytes + 40 tool-call bytes + the allowance of 4: a receipt claiming 50 tokens is inflated.
    expect(resumed.get("r-tools")!.delivered).toMatchObject({ tool_call_bytes: 40 });
    expect(deliveredOutputBound(resumed.get("r-tools")!.delivered!)).toBe(49);
    // Unknown tool-call bytes: no bound from the record (the chunk meter bounded it while it streamed).
    expect(resumed.get("r-old")!.delivered!.tool_call_bytes).toBeUndefined();
    expect(deliveredOutputBound(resumed.get("r-old")!.delivered!)).toBe(Infinity);
    await store.close();
  });
});
