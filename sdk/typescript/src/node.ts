/**
 * `@sectr/sdk/node`: the path helpers, for Node only (they read files).
 *
 *     import { imagePartFromPath, audioPartFromPath } from "@sectr/sdk/node";
 */

import { readFile, stat } from "node:fs/promises";
import { basename } from "node:path";

import { PromptValidationError } from "./errors.js";
import {
  type AudioPart,
  type ImageOptions,
  type ImagePart,
  PART_MAX_BYTES,
  audioPartFromBytes,
  imagePartFromBytes,
} from "./parts.js";

async function readPart(path: string): Promise<Uint8Array> {
  const info = await stat(path);
  if (info.size > PART_MAX_BYTES) {
    // Refused before a byte is read.
    throw new PromptValidationError(`${basename(path)} is larger than ${PART_MAX_BYTES / 1024 / 1024} MiB`, {
      code: "size",
    });
  }
  return new Uint8Array(await readFile(path));
}

/** An image upload part from a file; its type comes from its bytes, not its name. */
export async function imagePartFromPath(path: string, options: ImageOptions = {}): Promise<ImagePart> {
  return imagePartFromBytes(await readPart(path), options);
}

/** An audio upload part from a file (wav, mp3, flac, ogg, told apart by the bytes). */
export async function audioPartFromPath(path: string, options: { format?: string } = {}): Promise<AudioPart> {
  return audioPartFromBytes(await readPart(path), options);
}
