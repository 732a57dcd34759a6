/**
 * Typed errors, the same as the Python SDK's (`sectr.client.errors`). Every one is a
 * `SectrError` with `code` (machine-readable) and `status` (HTTP; 0 for a client-side
 * failure, except a `PromptValidationError` found before sending, which keeps 400).
 */

export class SectrError extends Error {
  readonly code: string;
  readonly status: number;
  readonly extra: Record<string, unknown>;

  constructor(message: string, options: { code?: string; status?: number; extra?: Record<string, unknown> } = {}) {
    super(message);
    this.name = new.target.name;
    const defaults = new.target as unknown as { defaultCode: string; defaultStatus: number };
    this.code = options.code ?? defaults.defaultCode;
    this.status = options.status ?? defaults.defaultStatus;
    this.extra = options.extra ?? {};
  }

  static defaultCode = "error";
  static defaultStatus = 0;
}

export class AuthenticationError extends SectrError {
  static override defaultCode = "unauthenticated";
  static override defaultStatus = 401;
}

export class PermissionDeniedError extends SectrError {
  static override defaultCode = "forbidden";
  static override defaultStatus = 403;
}

export class NotFoundError extends SectrError {
  static override defaultCode = "not_found";
  static override defaultStatus = 404;
}

export class InvalidStateError extends SectrError {
  static override defaultCode = "invalid_state";
}

export class SessionBusyError extends InvalidStateError {
  static override defaultCode = "session_busy";
  static override defaultStatus = 409;
}

/** The ask was decided (or withdrawn) already; `decidedBy` and `verdict` say how. */
export class AskAlreadyResolvedError extends InvalidStateError {
  static override defaultCode = "ask_not_pending";
  static override defaultStatus = 409;

  get decidedBy(): string | undefined {
    const value = this.extra["decided_by"];
    return value == null ? undefined : String(value);
  }

  get verdict(): string | undefined {
    const value = this.extra["verdict"];
    return value == null ? undefined : String(value);
  }
}

export class InvalidRequestError extends SectrError {
  static override defaultCode = "invalid";
  static override defaultStatus = 400;
}

export class PromptValidationError extends InvalidRequestError {
  static override defaultCode = "prompt";
}

export class RateLimitError extends SectrError {
  static override defaultCode = "rate_limited";
  static override defaultStatus = 429;
  retryAfter = 1;
}

export class TransportError extends SectrError {
  static override defaultCode = "transport";
}

/** The caller's `signal` aborted the call. */
export class RequestCancelledError extends TransportError {
  static override defaultCode = "cancelled";
}

/** `timeoutMs` passed before the call (or a run's consumption) finished. Only the client
 * stopped waiting: a run goes on on the server until `run.cancel()`. */
export class DeadlineExceededError extends TransportError {
  static override defaultCode = "deadline_exceeded";
}

export class ProtocolError extends SectrError {
  static override defaultCode = "protocol";
}

/** The server answered a redirect, which the API never does: `baseUrl` is wrong. */
export class RedirectError extends ProtocolError {
  static override defaultCode = "redirect";
  location: string | undefined;
}

const PROMPT_CODES = new Set(["capability", "mime_type", "size", "url", "prompt", "too_large"]);
const BUSY_CODES = new Set(["session_busy", "awaiting_approval"]);

/** The typed error for an HTTP error answer (`{"error": {"code", "message"}}`). */
export function errorFromResponse(status: number, body: string, headers?: Headers): SectrError {
  let code = `http_${status}`;
  let message = `HTTP ${status}`;
  let extra: Record<string, unknown> = {};
  try {
    const error = (JSON.parse(body) as { error: Record<string, unknown> }).error;
    if (typeof error.code !== "string" || typeof error.message !== "string") throw new Error("no code");
    code = error.code;
    message = error.message;
    extra = Object.fromEntries(Object.entries(error).filter(([key]) => key !== "code" && key !== "message"));
  } catch {
    if (status < 500) return new ProtocolError(`HTTP ${status} without an error body`, { status });
  }
  const options = { code, status, extra };
  if (status === 401) return new AuthenticationError(message, options);
  if (status === 403) return new PermissionDeniedError(message, options);
  if (status === 404) return new NotFoundError(message, options);
  if (status === 409 && BUSY_CODES.has(code)) return new SessionBusyError(message, options);
  if (status === 409 && code === "ask_not_pending") return new AskAlreadyResolvedError(message, options);
  if (status === 409 || status === 412) return new InvalidStateError(message, options);
  if ((status === 400 || status === 413) && PROMPT_CODES.has(code)) return new PromptValidationError(message, options);
  if (status === 400 || status === 413) return new InvalidRequestError(message, options);
  if (status === 429) {
    const error = new RateLimitError(message, options);
    const retryAfter = Number(headers?.get("retry-after") ?? "1");
    error.retryAfter = Number.isFinite(retryAfter) ? retryAfter : 1;
    return error;
  }
  return new SectrError(message, options);
}
