// The edge of the request actor: starts one per buyer request and plugs in its effects — choosing a
// provider and sending the job, relaying chunks to the buyer's responder, cancelling and releasing attempts.
import { createActor, fromCallback, type ActorRefFrom, type InspectionEvent } from "xstate";
import {
  requestMachine,
  type DispatchInput,
  type RequestContext,
  type RequestEvent,
  type RequestMachine,
} from "../../actors/request.ts";
import { gatewayError, type GatewayError } from "../http/errors.ts";
import type { ChatResponder } from "../http/chat/responders.ts";
import type { NormalizedChat } from "../http/chat/normalize.ts";
import { encodeFrame } from "../wire/codec.ts";
import type { EndFrame, JobRoute } from "../wire/frames.ts";
import { attemptKey, type Registry } from "./registry.ts";
import { chooseProvider } from "./routing.ts";
import type { Log } from "../log.ts";

export interface RequestSpec {
  requestId: string;
  chat: NormalizedChat;
  route: JobRoute;
  promptBound: number;
  responder: ChatResponder;
}

interface RequestHandle extends RequestSpec {
  actor: ActorRefFrom<RequestMachine>;
  startedAtMs: number;
  lastEnd: EndFrame | null;
}

export interface RequestRunnerDeps {
  registry: Registry;
  now: () => number;
  maxAttempts: number;
  firstByteTimeoutMs: number;
  streamIdleTimeoutMs: number;
  requestDeadlineMs: number;
  inspect?: (event: InspectionEvent) => void;
  onClosed: () => void;
  log: Log;
}

const unavailableMessages = {
  model_not_available: (model: string) => `The model '${model}' is not available. List available models with GET /v1/models.`,
  coordinator_unavailable: () => "No provider is free to serve this model right now. Retry shortly.",
} as const;

export function createRequestRunner(deps: RequestRunnerDeps) {
  const { registry, log } = deps;
  const handles = new Map<string, RequestHandle>();

  const currentKey = (c: RequestContext) => (c.current ? attemptKey(c.requestId, c.current.attemptN) : null);

  const dispatchAttempt = fromCallback<RequestEvent, DispatchInput>(({ input, sendBack }) => {
    const handle = handles.get(input.requestId);
    if (!handle) return;
    const { chat } = handle;
    const choice = chooseProvider(registry.providerViews(), chat.model, input.excludedProviders);
    if (!choice.ok) {
      sendBack({ type: "route.unavailable", code: choice.code, message: unavailableMessages[choice.code](chat.model) });
      return;
    }
    const session = registry.sessions.get(choice.provider.sessionId)!;
    const key = attemptKey(input.requestId, input.attemptN);
    const remaining = Math.max(1, deps.requestDeadlineMs - (deps.now() - handle.startedAtMs));
    // Encoded before the attempt is registered: encoding can throw on pathological buyer input (e.g.
    // deeply nested tool_calls overflow the stack), and a throw after addAttempt would leak the slot.
    const job = encodeFrame({
      type: "job",
      request_id: input.requestId,
      attempt_n: input.attemptN,
      model_id: chat.model,
      messages: chat.messages,
      params: chat.params,
      route: handle.route,
      deadline_ms: remaining,
    });
    registry.addAttempt({ key, requestId: input.requestId, attemptN: input.attemptN, request: handle.actor, session });
    session.send(job);
    log.debug("attempt_dispatched", { request_id: input.requestId, attempt_n: input.attemptN, provider_id: choice.provider.providerId });
    sendBack({
      type: "route.dispatched",
      attempt: { attemptN: input.attemptN, sessionId: session.sessionId, providerId: choice.provider.providerId },
    });
  });

  const machine = requestMachine.provide({
    actors: { dispatchAttempt },
    actions: {
      relayChunk: ({ context }, { frame }) => handles.get(context.requestId)?.responder.relay(frame),
      discardPartialOutput: ({ context }) => handles.get(context.requestId)?.responder.discard(),
      finishSuccess: ({ context, event }) => {
        const handle = handles.get(context.requestId);
        if (!handle) return;
        const end = event.type === "provider.ended" ? event.frame : null;
        const finishReason = context.lengthLimited ? "length" : (end?.finish_reason ?? "stop");
        // Prompt tokens as the provider reports them, never above the gateway's own bound.
        const promptTokens = Math.min(end?.usage.input_tokens ?? 0, handle.promptBound);
        handle.responder.succeed({ finishReason, usage: { prompt_tokens: promptTokens, completion_tokens: context.deliveredTokens } });
      },
      finishFailure: ({ context }) => {
        const failure = context.failure ?? { code: "coordinator_unavailable" as const, message: unavailableMessages.coordinator_unavailable() };
        const error: GatewayError = gatewayError(failure.code, failure.message, {
          retryAfterSeconds: failure.code === "coordinator_unavailable" ? 1 : undefined,
          param: failure.code === "model_not_available" ? "model" : undefined,
        });
        handles.get(context.requestId)?.responder.fail(error);
      },
      finishMidStreamError: ({ context }) =>
        handles
          .get(context.requestId)
          ?.responder.failMidStream(
            gatewayError("provider_disconnected", "The provider disconnected after the stream started. Retrying sends a new, separately billed request."),
          ),
      cancelAttempt: ({ context }, { reason }) => {
        const key = currentKey(context);
        const attempt = key ? registry.attempts.get(key) : undefined;
        if (!attempt || !context.current) return;
        attempt.session.send(
          encodeFrame({
            type: "cancel",
            request_id: context.requestId,
            attempt_n: context.current.attemptN,
            reason,
            delivered_output_bytes: context.deliveredBytes,
          }),
        );
        log.debug("attempt_cancelled", { request_id: context.requestId, attempt_n: context.current.attemptN, reason });
      },
      releaseAttempt: ({ context }) => {
        const key = currentKey(context);
        if (key) registry.releaseAttempt(key);
      },
    },
    delays: {
      firstByteTimeout: deps.firstByteTimeoutMs,
      streamIdleTimeout: deps.streamIdleTimeoutMs,
      requestDeadline: deps.requestDeadlineMs,
    },
  });

  /** Starts the request actor; the responder's `response` settles when the buyer can be answered. */
  function start(spec: RequestSpec): { abort: () => void } {
    const actor = createActor(machine, {
      input: { requestId: spec.requestId, streaming: spec.chat.stream, maxTokens: spec.chat.params.max_tokens, maxAttempts: deps.maxAttempts },
      inspect: deps.inspect,
    });
    const handle: RequestHandle = { ...spec, actor, startedAtMs: deps.now(), lastEnd: null };
    handles.set(spec.requestId, handle);
    actor.subscribe({
      complete: () => {
        handles.delete(spec.requestId);
        deps.onClosed();
      },
      error: (err) => {
        // A bug in one request ends that request only.
        log.error("request_actor_failed", { request_id: spec.requestId, error: String(err) });
        const key = currentKey(actor.getSnapshot().context);
        if (key) registry.releaseAttempt(key);
        spec.responder.fail(gatewayError("internal_error", "The gateway hit an internal error. Retry the request."));
        handles.delete(spec.requestId);
        deps.onClosed();
      },
    });
    actor.start();
    return { abort: () => actor.send({ type: "buyer.aborted" }) };
  }

  return { start, liveRequests: () => handles.size };
}

export type RequestRunner = ReturnType<typeof createRequestRunner>;
