/**
 * How NotebookOS numbers read on screen: the same words as the gateway's text/plain fallbacks.
 */

/** 1 -> "1st", 2 -> "2nd", 3 -> "3rd", 11 -> "11th", 22 -> "22nd". */
export function ordinal(n) {
  const tens = n % 100;
  if (tens >= 11 && tens <= 13) {
    return `${n}th`;
  }
  return `${n}${{ 1: 'st', 2: 'nd', 3: 'rd' }[n % 10] || 'th'}`;
}

/** A duration in milliseconds, short: "8 ms", "1.4 s", "2 min 5 s". */
export function duration(ms) {
  if (ms < 1000) {
    return `${Math.round(ms)} ms`;
  }
  const s = ms / 1000;
  if (s < 60) {
    return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  }
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

/** "2 GPUs" / "1 GPU" / "no GPU". */
export function gpus(n) {
  if (!n) {
    return 'no GPU';
  }
  return n === 1 ? '1 GPU' : `${n} GPUs`;
}

/** A replica's name as users read it: "r0" for replica 0 (ids that are not numbers stay as they are). */
export function replicaName(id) {
  return /^\d+$/.test(String(id)) ? `r${id}` : String(id);
}

/** The waiting notice's sentence, from the router's application/vnd.notebookos.wait+json payload. */
export function waitSentence(wait) {
  const parts = [`waiting for ${gpus(wait.gpus)}`];
  if (wait.position) {
    parts.push(`${ordinal(wait.position)} in queue`);
  } else if (wait.reason) {
    parts.push(wait.reason);
  }
  parts.push(`${Math.round(wait.waited_s || 0)} s`);
  return parts.join(', ');
}

/** "1 GPU (device 0)", "2 GPUs (devices 0, 1)", "no GPU": the devices a cell had, by their ordinals. */
export function devices(ordinals) {
  if (!ordinals.length) {
    return 'no GPU';
  }
  const label = ordinals.length === 1 ? 'device' : 'devices';
  return `${gpus(ordinals.length)} (${label} ${ordinals.join(', ')})`;
}

/**
 * The cell footer's line, from execute_reply.metadata.notebookos; null for a cell that shows none. A cell
 * aborted behind a failed one never ran and gets none (as with a plain kernel); a cell answered before it
 * reached a replica (interrupted while it waited for GPUs) says so, with how long it waited.
 */
export function footerLine(info) {
  if (info.aborted) {
    return null;
  }
  const queued = `queued ${duration(Number(info.queued_ms) || 0)}`;
  if (info.replica == null) {
    return `did not run · ${queued}`;
  }
  const used = devices(Array.isArray(info.gpus) ? info.gpus : []);
  const parts = [used, `replica ${replicaName(info.replica)} on ${info.host}`, queued];
  if (Number(info.attempt) > 1) {
    parts.push(`attempt ${info.attempt}`);
  }
  return parts.join(' · ');
}

/**
 * The footer of a cell that is running, from the kernel's summary (GET /notebookos/kernels/{id}) when it says
 * the kernel runs a cell: "running · 1 GPU · replica r1 on host-2"; just "running" until it does.
 */
export function runningLine(summary) {
  if (!summary || summary.state !== 'running' || summary.executor == null) {
    return 'running';
  }
  const executor = summary.replicas.find((r) => r.replica_id === summary.executor);
  const where = `replica ${replicaName(summary.executor)}` + (executor ? ` on ${executor.host}` : '');
  return ['running', gpus(summary.gpus), where].join(' · ');
}
