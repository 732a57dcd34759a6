/**
 * `@sectr/sdk`: sessions and runs of a Sectr server, for Node 20+ and browsers, with
 * fetch and web streams and no runtime dependencies. The path helpers
 * (`imagePartFromPath`, `audioPartFromPath`) are in `@sectr/sdk/node`.
 */

export {
  AFFINITY_HEADER,
  CONTROL_KEYS,
  Asks,
  type ClearOptions,
  type ClientOptions,
  type CreateOptions,
  type ForkOptions,
  type RequestControls,
  type Responders,
  Run,
  type RunOptions,
  Runs,
  SectrClient,
  Session,
  Sessions,
} from "./client.js";
export {
  AskAlreadyResolvedError,
  AuthenticationError,
  DeadlineExceededError,
  InvalidRequestError,
  InvalidStateError,
  NotFoundError,
  PermissionDeniedError,
  PromptValidationError,
  ProtocolError,
  RateLimitError,
  RedirectError,
  RequestCancelledError,
  SectrError,
  SessionBusyError,
  TransportError,
} from "./errors.js";
export {
  EVENT_KINDS,
  type PermissionAsk,
  type Placement,
  type ResolvedModel,
  type RunEvent,
  type RunEventKind,
  type RunInfo,
  type RunResult,
  SessionMode,
  type Snapshot,
  type Transcript,
  type TranscriptMessage,
  type Usage,
  Verdict,
} from "./models.js";
export {
  type AudioPart,
  type ImagePart,
  type MediaCapabilities,
  type Part,
  type Prompt,
  type TextPart,
  audioPartFromBlob,
  audioPartFromBytes,
  checkParts,
  imagePartFromBlob,
  imagePartFromBytes,
  imagePartFromUrl,
  sniffMime,
  textPart,
} from "./parts.js";
