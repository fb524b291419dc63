// Provider wire protocol v1 (docs/protocol.md): every frame shape, in one place.
// Frames are msgpack maps on binary WebSocket frames; byte strings are msgpack `bin` (Uint8Array here).
import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { TypeCompiler, type TypeCheck } from "@sinclair/typebox/compiler";

const Strict = { additionalProperties: false } as const;

export const ProviderId = Type.String({ pattern: "^[A-Za-z0-9._-]{1,64}$" });
export const RequestId = Type.String({ minLength: 1, maxLength: 128 });
export const AttemptN = Type.Integer({ minimum: 0, maximum: 255 });
export const ModelHash = Type.String({ pattern: "^[0-9a-f]{64}$" });
const ModelId = Type.String({ minLength: 1, maxLength: 256 });
const Bytes = (length: number) => Type.Uint8Array({ minByteLength: length, maxByteLength: length });
const Count = Type.Integer({ minimum: 0 });

export const ModelEntry = Type.Object(
  { model_id: ModelId, model_hash: ModelHash, max_context_tokens: Type.Integer({ minimum: 1 }) },
  Strict,
);
export type ModelEntry = Static<typeof ModelEntry>;
const ModelList = Type.Array(ModelEntry, { maxItems: 256 });

export const ProviderState = Type.Union([
  Type.Literal("ready"),
  Type.Literal("busy"),
  Type.Literal("asleep"),
  Type.Literal("draining"),
]);
export type ProviderState = Static<typeof ProviderState>;

export const TerminalState = Type.Union([
  Type.Literal("normal_done"),
  Type.Literal("provider_error"),
  Type.Literal("buyer_cancel"),
  Type.Literal("gateway_timeout"),
  Type.Literal("upstream_transport_disconnect"),
]);
export type TerminalState = Static<typeof TerminalState>;

export const ToolCallDelta = Type.Object(
  {
    index: Type.Integer({ minimum: 0 }),
    id: Type.Optional(Type.String()),
    name: Type.Optional(Type.String()),
    arguments: Type.Optional(Type.String()),
  },
  Strict,
);
export type ToolCallDelta = Static<typeof ToolCallDelta>;

// ---- provider → gateway ----

export const HelloFrame = Type.Object(
  {
    type: Type.Literal("hello"),
    protocol: Type.Literal(1),
    provider_id: ProviderId,
    receipt_public_key: Bytes(32),
    runtime: Type.Object({ name: Type.String({ maxLength: 64 }), version: Type.String({ maxLength: 64 }) }, Strict),
    hardware: Type.Object(
      { ram_gb: Type.Number({ minimum: 0 }), chip: Type.Optional(Type.String({ maxLength: 128 })) },
      Strict,
    ),
    max_concurrency: Type.Integer({ minimum: 1, maximum: 1024 }),
    models: ModelList,
  },
  Strict,
);
export type HelloFrame = Static<typeof HelloFrame>;

export const AuthFrame = Type.Object({ type: Type.Literal("auth"), signature: Bytes(64) }, Strict);
export type AuthFrame = Static<typeof AuthFrame>;

/**
 * A provider's load (optional in `heartbeat`: providers that do not send it are routed without it;
 * docs/protocol.md). Read by routing's shortest-wait policy and saturation rule (docs/routing.md).
 */
export const ProviderLoad = Type.Object(
  {
    /** Jobs accepted that have not produced output yet. */
    queued_jobs: Count,
    /** Output tokens per second decoded lately, all jobs together. */
    decode_tokens_per_s: Type.Number({ minimum: 0, maximum: 1e7 }),
    /** Output tokens still to come: each running job's max_tokens minus what it produced, summed. */
    outstanding_output_tokens: Count,
  },
  Strict,
);
export type ProviderLoad = Static<typeof ProviderLoad>;

export const HeartbeatFrame = Type.Object(
  { type: Type.Literal("heartbeat"), state: ProviderState, slots_free: Count, models: ModelList, load: Type.Optional(ProviderLoad) },
  Strict,
);
export type HeartbeatFrame = Static<typeof HeartbeatFrame>;

export const AcceptedFrame = Type.Object(
  { type: Type.Literal("accepted"), request_id: RequestId, attempt_n: AttemptN, model_hash: ModelHash },
  Strict,
);
export type AcceptedFrame = Static<typeof AcceptedFrame>;

export const DeclineCode = Type.Union([
  Type.Literal("queue_full"),
  Type.Literal("model_not_loaded"),
  Type.Literal("context_exceeded"),
  Type.Literal("internal"),
]);
export type DeclineCode = Static<typeof DeclineCode>;

export const DeclinedFrame = Type.Object(
  { type: Type.Literal("declined"), request_id: RequestId, attempt_n: AttemptN, code: DeclineCode },
  Strict,
);
export type DeclinedFrame = Static<typeof DeclinedFrame>;

export const ChunkFrame = Type.Object(
  {
    type: Type.Literal("chunk"),
    request_id: RequestId,
    attempt_n: AttemptN,
    seq: Count,
    content: Type.Optional(Type.String()),
    tool_calls: Type.Optional(Type.Array(ToolCallDelta, { maxItems: 128 })),
    tokens: Count,
  },
  Strict,
);
export type ChunkFrame = Static<typeof ChunkFrame>;

export const Usage = Type.Object({ input_tokens: Count, output_tokens: Count }, Strict);

export const EndFrame = Type.Object(
  {
    type: Type.Literal("end"),
    request_id: RequestId,
    attempt_n: AttemptN,
    terminal_state: TerminalState,
    finish_reason: Type.Union([Type.String({ maxLength: 64 }), Type.Null()]),
    usage: Usage,
    receipt: Type.Optional(Type.String({ maxLength: 16384 })),
  },
  Strict,
);
export type EndFrame = Static<typeof EndFrame>;

export const ReceiptFrame = Type.Object(
  { type: Type.Literal("receipt"), request_id: RequestId, attempt_n: AttemptN, receipt: Type.String({ maxLength: 16384 }) },
  Strict,
);
export type ReceiptFrame = Static<typeof ReceiptFrame>;

// ---- gateway → provider ----

export const ChallengeFrame = Type.Object(
  { type: Type.Literal("challenge"), session_id: Type.String(), nonce: Bytes(32) },
  Strict,
);
export type ChallengeFrame = Static<typeof ChallengeFrame>;

export const WelcomeFrame = Type.Object(
  {
    type: Type.Literal("welcome"),
    session_id: Type.String(),
    tier: Type.Union([Type.Literal("pinned"), Type.Literal("provisional")]),
    heartbeat_interval_ms: Type.Integer({ minimum: 1 }),
    catalog_id: Type.String(),
  },
  Strict,
);
export type WelcomeFrame = Static<typeof WelcomeFrame>;

export const JobMessage = Type.Object(
  {
    role: Type.String(),
    content: Type.Union([Type.String(), Type.Null()]),
    name: Type.Optional(Type.String()),
    tool_call_id: Type.Optional(Type.String()),
    tool_calls: Type.Optional(Type.Array(Type.Unknown())),
  },
  Strict,
);
export type JobMessage = Static<typeof JobMessage>;

export const JobParams = Type.Object(
  {
    max_tokens: Type.Integer({ minimum: 1 }),
    temperature: Type.Optional(Type.Number()),
    top_p: Type.Optional(Type.Number()),
    stop: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())])),
    seed: Type.Optional(Type.Integer()),
    presence_penalty: Type.Optional(Type.Number()),
    frequency_penalty: Type.Optional(Type.Number()),
    tools: Type.Optional(Type.Array(Type.Unknown())),
    tool_choice: Type.Optional(Type.Unknown()),
    parallel_tool_calls: Type.Optional(Type.Boolean()),
    response_format: Type.Optional(Type.Unknown()),
  },
  Strict,
);
export type JobParams = Static<typeof JobParams>;

export const JobRoute = Type.Object(
  {
    account_scope: Type.String(),
    catalog_id: Type.String(),
    catalog_body_digest: Type.String(),
    expected_catalog_model_hash: Type.String(),
    route_snapshot_digest: Type.String(),
    route_snapshot_mode: Type.Union([Type.Literal("observe"), Type.Literal("enforce")]),
    route_snapshot_policy_version: Type.String(),
    prompt_hash: Type.String(),
  },
  Strict,
);
export type JobRoute = Static<typeof JobRoute>;

export const JobFrame = Type.Object(
  {
    type: Type.Literal("job"),
    request_id: RequestId,
    attempt_n: AttemptN,
    model_id: ModelId,
    messages: Type.Array(JobMessage),
    params: JobParams,
    route: JobRoute,
    deadline_ms: Type.Integer({ minimum: 1 }),
  },
  Strict,
);
export type JobFrame = Static<typeof JobFrame>;

export const CancelFrame = Type.Object(
  {
    type: Type.Literal("cancel"),
    request_id: RequestId,
    attempt_n: AttemptN,
    reason: Type.Union([Type.Literal("buyer_cancel"), Type.Literal("gateway_timeout")]),
    delivered_output_bytes: Count,
  },
  Strict,
);
export type CancelFrame = Static<typeof CancelFrame>;

export const DrainFrame = Type.Object({ type: Type.Literal("drain") }, Strict);
export type DrainFrame = Static<typeof DrainFrame>;

export const SettledFrame = Type.Object(
  {
    type: Type.Literal("settled"),
    request_id: RequestId,
    attempt_n: AttemptN,
    label: Type.Union([
      Type.Literal("pending"),
      Type.Literal("verified"),
      Type.Literal("quarantined"),
      Type.Literal("zero_settled"),
    ]),
    reason: Type.Union([Type.String(), Type.Null()]),
    provider_credits: Count,
  },
  Strict,
);
export type SettledFrame = Static<typeof SettledFrame>;

export type ProviderFrame =
  | HelloFrame
  | AuthFrame
  | HeartbeatFrame
  | AcceptedFrame
  | DeclinedFrame
  | ChunkFrame
  | EndFrame
  | ReceiptFrame;
export type GatewayFrame = ChallengeFrame | WelcomeFrame | JobFrame | CancelFrame | DrainFrame | SettledFrame;

const compile = <T extends TSchema>(schema: T): TypeCheck<T> => TypeCompiler.Compile(schema);

/** Compiled checkers keyed by `type`, for frames a provider may send to the gateway. */
export const providerFrameCheckers: Record<ProviderFrame["type"], TypeCheck<TSchema>> = {
  hello: compile(HelloFrame),
  auth: compile(AuthFrame),
  heartbeat: compile(HeartbeatFrame),
  accepted: compile(AcceptedFrame),
  declined: compile(DeclinedFrame),
  chunk: compile(ChunkFrame),
  end: compile(EndFrame),
  receipt: compile(ReceiptFrame),
};

/** Compiled checkers keyed by `type`, for frames the gateway may send to a provider. */
export const gatewayFrameCheckers: Record<GatewayFrame["type"], TypeCheck<TSchema>> = {
  challenge: compile(ChallengeFrame),
  welcome: compile(WelcomeFrame),
  job: compile(JobFrame),
  cancel: compile(CancelFrame),
  drain: compile(DrainFrame),
  settled: compile(SettledFrame),
};

/** WebSocket close codes of the protocol (docs/protocol.md). */
export const CloseCode = {
  normal: 1000,
  goingAway: 1001,
  unsupportedData: 1003,
  invalidPayload: 1007,
  policyViolation: 1008,
  messageTooBig: 1009,
  invalidHello: 4001,
  handshakeTimeout: 4002,
  authFailed: 4003,
  provisionalPoolFull: 4007,
  provisionalRateLimited: 4008,
  banned: 4009,
  keyMismatch: 4010,
  replaced: 4011,
  heartbeatTimeout: 4012,
} as const;

/** Largest frame either side accepts (the WebSocket's maximum payload). */
export const MAX_FRAME_BYTES = 1024 * 1024;
