// A buyer process that holds live streams, so a test's heap holds only the gateway's side of them:
//   bun test/support/streamHolder.ts URL API_KEY N
// Opens N chat streams at once (distinct bodies, as buyers' are), reads each up to its first content
// delta, prints `live` when all are, and keeps them open until its stdin closes; then exits.
export {};
const [url, apiKey, count] = process.argv.slice(2);
const n = Number(count);
const readers = await Promise.all(
  Array.from({ length: n }, async (_, i) => {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "test-model", stream: true, max_tokens: 100, messages: [{ role: "user", content: `stream ${i}: ${"x".repeat(16 * 1024)}` }] }),
    });
    if (res.status !== 200) throw new Error(`stream ${i}: HTTP ${res.status} ${await res.text()}`);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    for (let seen = ""; !seen.includes('"content":"'); ) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`stream ${i} ended before its first delta: ${seen}`);
      seen += decoder.decode(value);
    }
    return reader;
  }),
);
console.log("live");
for await (const _ of Bun.stdin.stream());
await Promise.all(readers.map((r) => r.cancel()));
process.exit(0);
