// The upstream request: where it goes and what it carries. Pure.
import type { JobFrame } from "../../wire/frames.ts";

/**
 * The chat-completions URL for an `--upstream` base. The documented form is the server's root
 * (`http://127.0.0.1:8080`); a base that already ends in `/v1` (what OpenAI clients are usually
 * given, e.g. Ollama's `http://127.0.0.1:11434/v1`) or in `/chat/completions` works too.
 * Null when `base` is not an http(s) URL.
 */
export function chatCompletionsUrl(base: string): string | null {
  if (!URL.canParse(base)) return null;
  const url = new URL(base);
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  if (url.search !== "" || url.hash !== "") return null;
  const path = url.pathname.replace(/\/+$/, "");
  if (path.endsWith("/chat/completions")) url.pathname = path;
  else if (path.endsWith("/v1")) url.pathname = `${path}/chat/completions`;
  else url.pathname = `${path}/v1/chat/completions`;
  return url.toString();
}

/** Copies the keys of `from` that are present (not undefined): JSON bodies get no `null` stand-ins. */
function present<T extends object, K extends keyof T>(from: T, keys: readonly K[]): Partial<Pick<T, K>> {
  const out: Partial<Pick<T, K>> = {};
  for (const key of keys) if (from[key] !== undefined) out[key] = from[key];
  return out;
}

const MESSAGE_KEYS = ["role", "content", "name", "tool_call_id", "tool_calls"] as const;
// Every forwarded parameter of docs/buyer-api.md (the gateway already dropped `user`, `metadata`, `n`…).
const PARAM_KEYS = [
  "max_tokens",
  "temperature",
  "top_p",
  "stop",
  "seed",
  "presence_penalty",
  "frequency_penalty",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "response_format",
] as const;

/**
 * The JSON body for the upstream: the job's messages and parameters, the upstream's model name, and
 * always a stream with usage (`stream_options.include_usage`) so prompt tokens can be reported.
 */
export function upstreamBody(job: JobFrame, upstreamModel: string): Record<string, unknown> {
  return {
    model: upstreamModel,
    messages: job.messages.map((m) => present(m, MESSAGE_KEYS)),
    ...present(job.params, PARAM_KEYS),
    stream: true,
    stream_options: { include_usage: true },
  };
}

/** Request headers; the bearer only when an upstream key was configured. */
export function upstreamHeaders(apiKey: string | undefined): Record<string, string> {
  const headers: Record<string, string> = { "content-type": "application/json", accept: "text/event-stream" };
  if (apiKey !== undefined && apiKey !== "") headers.authorization = `Bearer ${apiKey}`;
  return headers;
}
