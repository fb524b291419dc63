// Public face of the `openai` engine (docs/operator.md): forwards provider jobs to a local OpenAI-compatible server.
export {
  createOpenAIEngine,
  DEFAULT_FIRST_TOKEN_TIMEOUT_MS,
  DEFAULT_IDLE_TIMEOUT_MS,
  type FetchFn,
  type OpenAIEngineOptions,
} from "./engine.ts";
export { chatCompletionsUrl } from "./request.ts";
