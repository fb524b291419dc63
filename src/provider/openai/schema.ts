// The upstream JSON shapes the openai engine reads, as TypeBox schemas. Deliberately loose: only the
// fields we use are described, extra fields are allowed (timings, __verbose, system_fingerprint,
// stop_reason, logprobs…), and every optional field may also be null, because local servers differ
// (fixtures/upstreams/README.md). A payload that fails these checks is a malformed event.
import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";

const Maybe = <T extends TSchema>(schema: T) => Type.Optional(Type.Union([schema, Type.Null()]));
const Count = Type.Number({ minimum: 0 });

export const ToolCallFragment = Type.Object({
  index: Maybe(Type.Integer({ minimum: 0, maximum: 127 })),
  id: Maybe(Type.String()),
  type: Maybe(Type.String()),
  function: Maybe(Type.Object({ name: Maybe(Type.String()), arguments: Maybe(Type.String()) })),
});
export type ToolCallFragment = Static<typeof ToolCallFragment>;

/** One choice's delta. Reasoning text is named `reasoning_content` (llama.cpp, LM Studio, older vLLM) or `reasoning` (Ollama, mlx_lm, newer vLLM). */
export const Delta = Type.Object({
  role: Maybe(Type.String()),
  content: Maybe(Type.String()),
  reasoning_content: Maybe(Type.String()),
  reasoning: Maybe(Type.String()),
  tool_calls: Maybe(Type.Array(ToolCallFragment, { maxItems: 128 })),
});

export const UpstreamUsage = Type.Object({ prompt_tokens: Maybe(Count), completion_tokens: Maybe(Count) });
export type UpstreamUsage = Static<typeof UpstreamUsage>;

/** One `chat.completion.chunk` (the `object` field is not checked: mlx_lm's usage chunk says `chat.completion`). */
export const StreamChunk = Type.Object({
  choices: Maybe(
    Type.Array(
      Type.Object({ index: Maybe(Type.Integer({ minimum: 0 })), delta: Maybe(Delta), finish_reason: Maybe(Type.String()) }),
    ),
  ),
  usage: Maybe(UpstreamUsage),
  // llama.cpp: `predicted_n` is the cumulative count of generated tokens (per chunk with timings_per_token).
  timings: Maybe(Type.Object({ predicted_n: Maybe(Count) })),
});
export type StreamChunk = Static<typeof StreamChunk>;

/** A non-streaming `chat.completion` (an upstream that ignores `stream: true` answers with one). */
export const Completion = Type.Object({
  choices: Type.Array(
    Type.Object({
      index: Maybe(Type.Integer({ minimum: 0 })),
      message: Type.Object({
        content: Maybe(Type.String()),
        reasoning_content: Maybe(Type.String()),
        reasoning: Maybe(Type.String()),
        tool_calls: Maybe(Type.Array(ToolCallFragment, { maxItems: 128 })),
      }),
      finish_reason: Maybe(Type.String()),
    }),
  ),
  usage: Maybe(UpstreamUsage),
});
export type Completion = Static<typeof Completion>;

/**
 * Error bodies, before or inside a stream: `{"error": {...}}` (llama.cpp, vLLM ≥ 0.10.1, Ollama /v1,
 * newer mid-stream frames), `{"error": "text"}` (mlx_lm, Ollama native), or vLLM ≤ 0.10.0's flat
 * `{"object": "error", "message", "type", "code"}`.
 */
export const ErrorDetail = Type.Object({
  message: Maybe(Type.String()),
  type: Maybe(Type.String()),
  code: Maybe(Type.Union([Type.String(), Type.Number()])),
});
export const ErrorBody = Type.Union([
  Type.Object({ error: Type.Union([ErrorDetail, Type.String()]) }),
  Type.Intersect([Type.Object({ object: Type.Literal("error") }), ErrorDetail]),
]);
export type ErrorBody = Static<typeof ErrorBody>;

export const streamChunkChecker = TypeCompiler.Compile(StreamChunk);
export const completionChecker = TypeCompiler.Compile(Completion);
export const errorBodyChecker = TypeCompiler.Compile(ErrorBody);
