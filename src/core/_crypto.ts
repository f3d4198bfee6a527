// SHA-256 with Web Crypto, for key digests and hashed names.

/** SHA-256 of a string's UTF-8 bytes. */
export async function sha256(text: string | Uint8Array<ArrayBuffer>): Promise<Uint8Array> {
  const bytes = typeof text === "string" ? new TextEncoder().encode(text) : text;
  return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
}

/** SHA-256 of a string's UTF-8 bytes (or of bytes), in lower-case hex. */
export async function sha256Hex(text: string | Uint8Array<ArrayBuffer>): Promise<string> {
  return Array.from(await sha256(text), (b) => b.toString(16).padStart(2, "0")).join("");
}
