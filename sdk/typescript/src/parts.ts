/**
 * Prompt parts, and the checks made before anything is sent: the same rules the server
 * applies (it checks again), so a bad part fails at once with the code the server would
 * answer (`size`, `mime_type`, `url`, `capability`, `prompt`) and nothing is uploaded.
 * Types come from the bytes' magic numbers, never from a name or a label.
 *
 * Audio is uploaded, never given by URL (the server refuses it: providers take audio
 * inline only): fetch the clip and pass its Blob to `audioPartFromBlob`.
 */

import { PromptValidationError } from "./errors.js";

export const PART_MAX_BYTES = 10 * 1024 * 1024;
export const PROMPT_MAX_BYTES = 20 * 1024 * 1024;
export const PROMPT_MAX_PARTS = 16;
export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"] as const;
export const AUDIO_FORMATS: Record<string, string> = {
  wav: "audio/wav",
  mp3: "audio/mpeg",
  flac: "audio/flac",
  ogg: "audio/ogg",
};
const URL_MAX_LENGTH = 2048;
const BLOCKED_HOSTNAMES = new Set(["localhost", "metadata", "metadata.google.internal", "instance-data"]);
const BLOCKED_HOST_SUFFIXES = [".localhost", ".internal", ".local", ".localdomain"];

export interface TextPart {
  type: "text";
  text: string;
}
export interface ImagePart {
  type: "image_url";
  image_url: { url: string; detail?: "auto" | "low" | "high" };
}
export interface AudioPart {
  type: "input_audio";
  input_audio: { data: string; format: string };
}
export type Part = TextPart | ImagePart | AudioPart;
/** What a run is started with: text, or a list of parts. */
export type Prompt = string | Part[];

function refuse(code: string, message: string): PromptValidationError {
  return new PromptValidationError(message, { code });
}

function startsWith(data: Uint8Array, prefix: number[], at = 0): boolean {
  return prefix.every((byte, index) => data[at + index] === byte);
}

const ascii = (text: string): number[] => Array.from(text, (ch) => ch.charCodeAt(0));

/** The media type the bytes announce (the types the server accepts), or undefined. */
export function sniffMime(data: Uint8Array): string | undefined {
  if (startsWith(data, [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) return "image/png";
  if (startsWith(data, [0xff, 0xd8, 0xff])) return "image/jpeg";
  if (startsWith(data, ascii("GIF87a")) || startsWith(data, ascii("GIF89a"))) return "image/gif";
  if (startsWith(data, ascii("RIFF")) && startsWith(data, ascii("WEBP"), 8)) return "image/webp";
  if (startsWith(data, ascii("RIFF")) && startsWith(data, ascii("WAVE"), 8)) return "audio/wav";
  if (startsWith(data, ascii("fLaC"))) return "audio/flac";
  if (startsWith(data, ascii("OggS"))) return "audio/ogg";
  if (startsWith(data, ascii("ID3"))) return "audio/mpeg";
  if (data.length > 1 && data[0] === 0xff && ((data[1] ?? 0) & 0xe0) === 0xe0) return "audio/mpeg";
  return undefined;
}

function checkSize(size: number, what: string): void {
  if (size > PART_MAX_BYTES) throw refuse("size", `${what} is larger than ${PART_MAX_BYTES / 1024 / 1024} MiB`);
  if (size === 0) throw refuse("prompt", `${what} is empty`);
}

/** Base64 without Node's Buffer (browsers have none). */
export function toBase64(data: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < data.length; i += 0x8000) {
    binary += String.fromCharCode(...data.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text: string, what: string): Uint8Array {
  if ((text.length * 3) / 4 > PART_MAX_BYTES + 3) {
    throw refuse("size", `${what} is larger than ${PART_MAX_BYTES / 1024 / 1024} MiB`);
  }
  let binary: string;
  try {
    binary = atob(text);
  } catch {
    throw refuse("prompt", `${what} is not valid base64`);
  }
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  checkSize(out.length, what);
  return out;
}

export function textPart(text: string): TextPart {
  return { type: "text", text };
}

export interface ImageOptions {
  /** Refused (`mime_type`) when the bytes say otherwise. */
  mimeType?: string;
  detail?: "auto" | "low" | "high";
}

/** An image upload part from bytes (png, jpeg, gif, webp, told apart by the bytes). */
export function imagePartFromBytes(data: Uint8Array, options: ImageOptions = {}): ImagePart {
  checkSize(data.length, "the image");
  const sniffed = sniffMime(data);
  if (!sniffed || !(IMAGE_TYPES as readonly string[]).includes(sniffed)) {
    throw refuse("mime_type", `the bytes are not an image the server accepts (${IMAGE_TYPES.join(", ")})`);
  }
  if (options.mimeType !== undefined && options.mimeType.toLowerCase() !== sniffed) {
    throw refuse("mime_type", `the image is declared ${options.mimeType} but its bytes are ${sniffed}`);
  }
  const image: ImagePart["image_url"] = { url: `data:${sniffed};base64,${toBase64(data)}` };
  if (options.detail) image.detail = options.detail;
  return { type: "image_url", image_url: image };
}

/** An image upload part from a Blob or File (its `type` is a label; the bytes decide). */
export async function imagePartFromBlob(blob: Blob, options: ImageOptions = {}): Promise<ImagePart> {
  checkSize(blob.size, "the image"); // before reading megabytes
  const declared = options.mimeType ?? (blob.type || undefined);
  return imagePartFromBytes(new Uint8Array(await blob.arrayBuffer()), { ...options, mimeType: declared });
}

/** An image by absolute https URL (the provider fetches it; Sectr never does). */
export function imagePartFromUrl(url: string, options: Pick<ImageOptions, "detail"> = {}): ImagePart {
  checkUrl(url);
  const image: ImagePart["image_url"] = { url };
  if (options.detail) image.detail = options.detail;
  return { type: "image_url", image_url: image };
}

/** An audio upload part from bytes (wav, mp3, flac, ogg, told apart by the bytes). */
export function audioPartFromBytes(data: Uint8Array, options: { format?: string } = {}): AudioPart {
  checkSize(data.length, "the audio");
  const sniffed = sniffMime(data);
  const found = Object.keys(AUDIO_FORMATS).find((format) => AUDIO_FORMATS[format] === sniffed);
  if (!found) {
    throw refuse("mime_type", `the bytes are not audio the server accepts (${Object.keys(AUDIO_FORMATS).join(", ")})`);
  }
  if (options.format !== undefined && options.format.toLowerCase() !== found) {
    throw refuse("mime_type", `the audio is declared ${options.format} but its bytes are ${found}`);
  }
  return { type: "input_audio", input_audio: { data: toBase64(data), format: found } };
}

/** An audio upload part from a Blob or File. */
export async function audioPartFromBlob(blob: Blob, options: { format?: string } = {}): Promise<AudioPart> {
  checkSize(blob.size, "the audio");
  return audioPartFromBytes(new Uint8Array(await blob.arrayBuffer()), options);
}

function isPrivateLiteral(host: string): boolean {
  const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  if (v4) {
    const [a, b] = [Number(v4[1]), Number(v4[2])];
    return (
      a === 0 || a === 10 || a === 127 || (a === 169 && b === 254) || (a === 172 && b >= 16 && b <= 31) ||
      (a === 192 && b === 168) || (a === 100 && b >= 64 && b <= 127) || a >= 224
    );
  }
  if (host.startsWith("[")) {
    const v6 = host.slice(1, -1).toLowerCase();
    return v6 === "::1" || v6 === "::" || v6.startsWith("fe80:") || v6.startsWith("fc") || v6.startsWith("fd") ||
      v6.startsWith("::ffff:");
  }
  return false;
}

/** Absolute https, no credentials, no host that is plainly not public. */
export function checkUrl(url: unknown): void {
  if (typeof url !== "string" || !url || url.length > URL_MAX_LENGTH) {
    throw refuse("url", `a media URL is a string of at most ${URL_MAX_LENGTH} characters`);
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw refuse("url", "the media URL is malformed");
  }
  if (parsed.protocol !== "https:") throw refuse("url", "media URLs must be absolute https URLs");
  const host = parsed.hostname.replace(/\.$/, "").toLowerCase();
  if (!host) throw refuse("url", "the media URL has no host");
  if (parsed.username || parsed.password) throw refuse("url", "media URLs must not carry credentials");
  if (BLOCKED_HOSTNAMES.has(host) || BLOCKED_HOST_SUFFIXES.some((suffix) => host.endsWith(suffix))) {
    throw refuse("url", `media URLs must not point at ${host}`);
  }
  if (isPrivateLiteral(host)) {
    throw refuse("url", "media URLs must not point at loopback, private, link-local or metadata addresses");
  }
}

/** What a session's model accepts (a snapshot's `media`). */
export interface MediaCapabilities {
  image: boolean;
  audio: boolean;
}

/** Check a prompt before it is sent (count, source, type by its bytes, size, and the
 * session's media capabilities when known); throws PromptValidationError. */
export function checkParts(content: unknown, media?: MediaCapabilities): void {
  if (typeof content === "string") return;
  if (!Array.isArray(content) || content.length === 0) {
    throw refuse("prompt", "content must be a string or a non-empty list of parts");
  }
  if (content.length > PROMPT_MAX_PARTS) {
    throw refuse("prompt", `a prompt has at most ${PROMPT_MAX_PARTS} parts, not ${content.length}`);
  }
  let total = 0;
  content.forEach((part: unknown, index) => {
    const what = `part ${index}`;
    const kind = typeof part === "object" && part !== null ? (part as { type?: unknown }).type : undefined;
    if (kind === "text") {
      if (typeof (part as TextPart).text !== "string") throw refuse("prompt", `${what}: a text part needs a string text`);
      return;
    }
    if (kind !== "image_url" && kind !== "input_audio") {
      throw refuse("prompt", `${what}: the type must be text, image_url or input_audio`);
    }
    const mediaKind = kind === "image_url" ? "image" : "audio";
    if (media && media[mediaKind] === false) {
      throw refuse("capability", `the session's model does not accept ${mediaKind} input`);
    }
    total += kind === "image_url" ? checkImage(part as ImagePart, what) : checkAudio(part as AudioPart, what);
  });
  if (total > PROMPT_MAX_BYTES) {
    throw refuse("size", `the parts of a prompt are at most ${PROMPT_MAX_BYTES / 1024 / 1024} MiB together`);
  }
}

function checkImage(part: ImagePart, what: string): number {
  const url = part.image_url?.url;
  if (typeof url !== "string") throw refuse("prompt", `${what} needs image_url.url (a data: URL or an https URL)`);
  if (url.slice(0, 5).toLowerCase() !== "data:") {
    checkUrl(url);
    return 0;
  }
  const comma = url.indexOf(",");
  const declared = url.slice(5, comma < 0 ? undefined : comma).split(";")[0]?.trim().toLowerCase() ?? "";
  if (!(IMAGE_TYPES as readonly string[]).includes(declared)) {
    throw refuse("mime_type", `${what}: images are ${IMAGE_TYPES.join(", ")}, not ${declared || "untyped"}`);
  }
  const data = fromBase64(comma < 0 ? "" : url.slice(comma + 1), what);
  if (sniffMime(data) !== declared) throw refuse("mime_type", `${what} is declared ${declared} but its bytes are not`);
  return data.length;
}

function checkAudio(part: AudioPart, what: string): number {
  const audio = part.input_audio as Partial<AudioPart["input_audio"]> & { url?: string };
  if (typeof audio !== "object" || audio === null) throw refuse("prompt", `${what} needs input_audio: {data, format}`);
  if (audio.url !== undefined && audio.data === undefined) {
    throw refuse("url", `${what}: audio must be uploaded as data (providers take audio inline only)`);
  }
  const format = String(audio.format ?? "").toLowerCase();
  const declared = AUDIO_FORMATS[format];
  if (!declared) throw refuse("mime_type", `${what}: audio formats are ${Object.keys(AUDIO_FORMATS).join(", ")}`);
  if (typeof audio.data !== "string" || !audio.data) throw refuse("prompt", `${what} needs base64 data`);
  const data = fromBase64(audio.data, what);
  if (sniffMime(data) !== declared) throw refuse("mime_type", `${what} is declared ${format} but its bytes are not`);
  return data.length;
}
