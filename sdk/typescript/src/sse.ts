/** An incremental text/event-stream parser (the WHATWG rules the API needs). */

export interface ServerSentEvent {
  event: string;
  data: string;
  id: string | undefined;
}

export class SSEDecoder {
  private buffer = "";
  private event = "";
  private data: string[] = [];
  private id: string | undefined;
  private readonly text = new TextDecoder();

  feed(chunk: Uint8Array): ServerSentEvent[] {
    this.buffer += this.text.decode(chunk, { stream: true });
    const events: ServerSentEvent[] = [];
    let newline: number;
    while ((newline = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, newline).replace(/\r$/, "");
      this.buffer = this.buffer.slice(newline + 1);
      const event = this.line(line);
      if (event) events.push(event);
    }
    return events;
  }

  private line(line: string): ServerSentEvent | undefined {
    if (line === "") {
      if (this.data.length === 0 && !this.event) return undefined;
      const event = { event: this.event || "message", data: this.data.join("\n"), id: this.id };
      this.event = "";
      this.data = [];
      return event;
    }
    if (line.startsWith(":")) return undefined; // a comment: the server's heartbeat
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return undefined;
  }
}
