// Runs a Deno entry as a subprocess and waits until it prints a line matching `ready`.

export interface Spawned {
  child: Deno.ChildProcess;
  /** Everything it printed so far. */
  output(): string;
  /** Sends `signal` and waits for the exit status. */
  stop(signal?: Deno.Signal): Promise<Deno.CommandStatus>;
}

export async function spawnDeno(
  args: string[],
  env: Record<string, string>,
  ready: RegExp,
  timeoutMs = 30_000,
): Promise<Spawned> {
  const child = new Deno.Command(Deno.execPath(), {
    args,
    env: { ...env, NO_COLOR: "1" },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let text = "";
  let resolveReady: () => void;
  const isReady = new Promise<void>((resolve) => resolveReady = resolve);
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      if (ready.test(text)) resolveReady();
    }
  };
  const pumps = Promise.all([pump(child.stdout), pump(child.stderr)]);
  let stopped: Promise<Deno.CommandStatus> | undefined;
  const spawned: Spawned = {
    child,
    output: () => text,
    stop(signal = "SIGTERM") {
      stopped ??= (async () => {
        try {
          child.kill(signal);
        } catch { /* already exited */ }
        const status = await child.status;
        await pumps;
        return status;
      })();
      return stopped;
    },
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  const outcome = await Promise.race([
    isReady.then(() => "ready"),
    child.status.then(() => "exited"),
    new Promise((resolve) => timer = setTimeout(() => resolve("timeout"), timeoutMs)),
  ]);
  clearTimeout(timer);
  if (outcome !== "ready") {
    await spawned.stop("SIGKILL");
    throw new Error(`deno ${args.join(" ")} did not start (${outcome}):\n${text}`);
  }
  return spawned;
}
