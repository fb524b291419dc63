// The provider's start-up check of its inference server (docs/openai-engine.md, "Start-up check"): GET
// {upstream}/v1/models with the key, and every served model must be listed. Until it passes the runtime
// advertises no model; failures are retried with backoff and each says what is wrong in plain words.
import { chatCompletionsUrl } from "./request.ts";

export type UpstreamProblem = "unreachable" | "key_refused" | "no_models_endpoint" | "bad_answer" | "model_missing";

export type UpstreamCheck =
  | { ok: true; listed: string[]; /** Names the server lists under another id but still answers (llama-server). */ lenient: string[] }
  | { ok: false; problem: UpstreamProblem; message: string };

export interface UpstreamCheckInput {
  upstream: string;
  apiKey?: string;
  /** Upstream model names the served models are sent as. */
  modelNames: readonly string[];
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  timeoutMs?: number;
}

/** {root}/v1/models, from whatever form --upstream was given in (root, …/v1, …/v1/chat/completions). */
export function modelsUrl(upstream: string): string | null {
  const chat = chatCompletionsUrl(upstream);
  return chat === null ? null : chat.replace(/\/chat\/completions$/, "/models");
}

export async function checkUpstream(input: UpstreamCheckInput): Promise<UpstreamCheck> {
  const url = modelsUrl(input.upstream);
  if (url === null) return { ok: false, problem: "unreachable", message: `${input.upstream} is not an http(s) URL` };
  const doFetch = input.fetch ?? fetch;
  let response: Response;
  try {
    response = await doFetch(url, {
      headers: input.apiKey ? { authorization: `Bearer ${input.apiKey}` } : {},
      signal: AbortSignal.timeout(input.timeoutMs ?? 10_000),
    });
  } catch (error) {
    const code = (error as { code?: string }).code ?? (error as Error).name;
    return {
      ok: false,
      problem: "unreachable",
      message: `nothing answers at ${url} (${code}). Is the inference server (llama-server, Ollama, vLLM, …) running, and is --upstream its address? llama-server listens on 8080 and Ollama on 11434 by default.`,
    };
  }
  if (response.status === 401 || response.status === 403) {
    await response.body?.cancel();
    return {
      ok: false,
      problem: "key_refused",
      message: `${url} refused the key (HTTP ${response.status}). ${input.apiKey ? "The upstream key given (--upstream-key-file, GATEWAY_UPSTREAM_KEY or --upstream-key) is not the server's --api-key." : "The server wants a key: give it with --upstream-key-file or GATEWAY_UPSTREAM_KEY."}`,
    };
  }
  if (response.status === 404) {
    await response.body?.cancel();
    return { ok: false, problem: "no_models_endpoint", message: `${url} is 404: --upstream should be the server's root (e.g. http://127.0.0.1:8080), and the server OpenAI-compatible.` };
  }
  let body: unknown;
  try {
    body = response.ok ? await response.json() : null;
  } catch {
    body = null;
  }
  const data = (body as { data?: unknown } | null)?.data;
  if (!response.ok || !Array.isArray(data)) {
    return { ok: false, problem: "bad_answer", message: `${url} answered HTTP ${response.status} without a model list; is --upstream an OpenAI-compatible server?` };
  }
  const entries = data.filter((m): m is { id: string; owned_by?: unknown } => typeof (m as { id?: unknown })?.id === "string");
  const listed = entries.map((m) => m.id);
  // llama-server serves its one loaded model whatever name a request carries, and lists it under its
  // file path or --alias: a different name is fine there, and only worth a note.
  const answersAnyName = entries.length === 1 && entries[0]!.owned_by === "llamacpp";
  const missing = input.modelNames.filter((name) => !listed.includes(name));
  if (missing.length > 0 && !answersAnyName) {
    return {
      ok: false,
      problem: "model_missing",
      message: `the server at ${url} does not serve ${missing.map((m) => `'${m}'`).join(", ")} (it lists ${listed.length > 0 ? listed.map((m) => `'${m}'`).join(", ") : "no model"}). Load the model (e.g. ollama pull ${missing[0]}), or map the serve id to a listed name with --upstream-model SERVE_ID=NAME.`,
    };
  }
  return { ok: true, listed, lenient: answersAnyName ? missing : [] };
}
