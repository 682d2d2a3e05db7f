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

/** The cell footer's line, from execute_reply.metadata.notebookos. */
export function footerLine(info) {
  const devices = Array.isArray(info.gpus) ? info.gpus : [];
  const used = devices.length ? `${gpus(devices.length)} (${devices.join(', ')})` : 'no GPU';
  const where = `replica ${replicaName(info.replica ?? '?')} on ${info.host ?? '?'}`;
  const parts = [used, where, `queued ${duration(Number(info.queued_ms) || 0)}`];
  if (Number(info.attempt) > 1) {
    parts.push(`attempt ${info.attempt}`);
  }
  return parts.join(' · ');
}
