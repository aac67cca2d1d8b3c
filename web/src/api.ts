// The console's calls to the daemon: the API (/v1/…) with the session
// cookie and the session's CSRF token, and the session calls
// (/console/…). Wire types are the TypeScript SDK's.
import type {
  AuditEvent, Checkpoint, CreateCheckpoint, CreateSandbox, FileInfo, SandboxInfo, ServiceStatus, Template,
} from '../../sdk/ts/src/types'

export type { AuditEvent, Checkpoint, CreateCheckpoint, CreateSandbox, FileInfo, ServiceStatus, Template }

/** A sandbox as the list and GET show it: the SDK's, with its disk use. */
export interface Sandbox extends SandboxInfo {
  disk?: { used_bytes?: number, limit_mib: number, enforced: boolean }
}

/** WebSocket subprotocols (api.WebSocketProtocol; console.CSRFProtocolPrefix). */
const WS_PROTOCOL = 'loam.v1'
const CSRF_PROTOCOL_PREFIX = 'loam.csrf.'
const CSRF_HEADER = 'X-Loam-CSRF'

/** An error of the API, with its code and the API's own message. */
export class ApiError extends Error {
  constructor (readonly status: number, readonly code: string, message: string) {
    super(message)
  }
}

let csrf = ''
/** The daemon's idle for sandboxes created without one ("0": never), from the session. */
let daemonIdle = '0'

/** Whether the page holds a session (after login or resume). */
export function loggedIn (): boolean { return csrf !== '' }

async function errorOf (res: Response): Promise<ApiError> {
  try {
    const body = await res.json()
    if (body?.error?.code) return new ApiError(res.status, body.error.code, body.error.message)
  } catch { /* not the API's error shape */ }
  return new ApiError(res.status, 'unknown', `${res.status} ${res.statusText}`)
}

/** Logs in with the API token; the daemon sets the session cookie. */
export async function login (token: string): Promise<void> {
  const res = await fetch('/console/login', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ token }),
  })
  if (!res.ok) throw await errorOf(res)
  session(await res.json())
}

/** The scope of the key the session is of: admin, write or read. */
let scope = 'admin'
/** The session's org and key id, which the header shows. */
let who = ''

/** Keeps what a login or a resume answered (console.SessionInfo). */
function session (info: { csrf_token: string, idle?: string, scope?: string, org?: string, key?: string }): void {
  csrf = info.csrf_token
  daemonIdle = info.idle || '0'
  scope = info.scope || 'admin'
  who = info.org ? `${info.org} · ${info.key ?? ''} (${scope})` : ''
}

/**
 * Whether the session's key may change things, run commands and read
 * files (scope write or admin): a read key's console shows those actions
 * disabled rather than failing after the click.
 */
export function canWrite (): boolean { return scope !== 'read' }

/** Whether the session's key is an org admin's (the audit log is theirs). */
export function canAdmin (): boolean { return scope === 'admin' }

/** Why the audit log is disabled for a key that is not an admin's, for its title. */
export const notAdmin = "the audit log is for an org's admin keys; this key's scope is not admin"

/** Why an action is disabled for a read key, for its title. */
export const readOnly = 'this key is read-only: it may list and look, not change, run or read files'

/** Who the session is: "org · key (scope)". */
export function sessionWho (): string { return who }

/** The daemon's idle for a sandbox created without one: "10m", or "0" for never. */
export function defaultIdle (): string { return daemonIdle }

/**
 * Where the daemon keeps its token (console.LoginHint): the file's path, ''
 * when the token was given to the daemon, undefined when the daemon did not say.
 */
export async function loginHint (): Promise<string | undefined> {
  try {
    const res = await fetch('/console/login')
    if (!res.ok) return undefined
    return (await res.json()).token_file ?? ''
  } catch {
    return undefined
  }
}

/** Picks up the session of the cookie after a reload; false when there is none. */
export async function resume (): Promise<boolean> {
  const res = await fetch('/console/session')
  if (!res.ok) return false
  session(await res.json())
  return true
}

export async function logout (): Promise<void> {
  await fetch('/console/logout', { method: 'POST', headers: { [CSRF_HEADER]: csrf } })
  csrf = ''
}

/** Listeners told when the session is gone (a 401), so the page shows the login. */
const onLogout = new Set<() => void>()
export function whenLoggedOut (f: () => void): () => void {
  onLogout.add(f)
  return () => onLogout.delete(f)
}

/** Calls the API; the answer's JSON, or undefined for 204. */
export async function call<T> (method: string, path: string, body?: unknown, raw?: BodyInit): Promise<T> {
  const headers: Record<string, string> = { [CSRF_HEADER]: csrf }
  let payload: BodyInit | undefined = raw
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json'
    payload = JSON.stringify(body)
  }
  const res = await fetch('/v1' + path, { method, headers, body: payload })
  if (!res.ok) {
    const err = await errorOf(res)
    if (res.status === 401) {
      csrf = ''
      onLogout.forEach(f => f())
    }
    throw err
  }
  if (res.status === 204) return undefined as T
  return await res.json() as T
}

/** Fetches a binary answer (a file's content) as a Blob. */
export async function blob (path: string): Promise<Blob> {
  const res = await fetch('/v1' + path, { headers: { [CSRF_HEADER]: csrf } })
  if (!res.ok) throw await errorOf(res)
  return await res.blob()
}

/** Opens an API WebSocket (exec, attach, service logs) with the session. */
export function socket (path: string): WebSocket {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:'
  const ws = new WebSocket(`${scheme}//${location.host}/v1${path}`, [WS_PROTOCOL, CSRF_PROTOCOL_PREFIX + csrf])
  ws.binaryType = 'arraybuffer'
  return ws
}

export const enc = encodeURIComponent

/** Stream bytes of exec and attach frames (api.StreamStdin, …). */
export const STDIN = 0
export const STDOUT = 1
export const STDERR = 2

/** The sandbox's API calls the page makes. */
export const sandboxes = {
  list: async (labels: string[]) => (await call<{ sandboxes: Sandbox[] }>('GET', '/sandboxes' + (labels.length > 0 ? '?' + labels.map(l => 'label=' + enc(l)).join('&') : ''))).sandboxes,
  get: async (name: string) => await call<Sandbox>('GET', `/sandboxes/${enc(name)}`),
  create: async (req: CreateSandbox) => await call<Sandbox>('POST', '/sandboxes', req),
  remove: async (name: string) => await call<void>('DELETE', `/sandboxes/${enc(name)}`),
  sleep: async (name: string) => await call<Sandbox>('POST', `/sandboxes/${enc(name)}/sleep`),
  wake: async (name: string) => await call<Sandbox>('POST', `/sandboxes/${enc(name)}/wake`),
  templates: async () => (await call<{ templates: Template[] }>('GET', '/templates')).templates,
  accessURL: async (name: string) => await call<{ url: string, access_token: string }>('GET', `/sandboxes/${enc(name)}/access-token`),
}

export const checkpoints = {
  list: async (sb: string) => (await call<{ checkpoints: Checkpoint[] }>('GET', `/sandboxes/${enc(sb)}/checkpoints`)).checkpoints,
  create: async (sb: string, req: CreateCheckpoint) => await call<Checkpoint>('POST', `/sandboxes/${enc(sb)}/checkpoints`, req),
  remove: async (sb: string, cp: string) => await call<void>('DELETE', `/sandboxes/${enc(sb)}/checkpoints/${enc(cp)}`),
  restore: async (sb: string, cp: string) => await call<Sandbox>('POST', `/sandboxes/${enc(sb)}/checkpoints/${enc(cp)}/restore`),
}

export const files = {
  list: async (sb: string, path: string) => await call<FileInfo>('GET', `/sandboxes/${enc(sb)}/files?path=${enc(path)}`),
  download: async (sb: string, path: string) => await blob(`/sandboxes/${enc(sb)}/files/content?path=${enc(path)}`),
  upload: async (sb: string, path: string, body: Blob) => await call<FileInfo>('PUT', `/sandboxes/${enc(sb)}/files/content?path=${enc(path)}`, undefined, body),
  remove: async (sb: string, path: string, recursive: boolean) => await call<void>('DELETE', `/sandboxes/${enc(sb)}/files?path=${enc(path)}${recursive ? '&recursive=true' : ''}`),
}

export const services = {
  list: async (sb: string) => (await call<{ services: ServiceStatus[] }>('GET', `/sandboxes/${enc(sb)}/services`)).services,
  action: async (sb: string, name: string, action: 'start' | 'stop' | 'restart') => await call<ServiceStatus>('POST', `/sandboxes/${enc(sb)}/services/${enc(name)}/${action}`),
}

/** The most events the API answers at once (api.MaxAuditPage). */
const AUDIT_PAGE = 1000

/** The most pages of events the console reads for one view. */
const AUDIT_PAGES = 20

export const audit = {
  /**
   * The newest events (at most show) since a time or how long ago
   * ("24h"), of action ('' for all), newest first; total is how many the
   * window holds, and cut says the window held more than the console
   * reads (AUDIT_PAGES pages), so that total is only where it stopped.
   */
  list: async (since: string, action: string, show: number): Promise<{ events: AuditEvent[], total: number, cut: boolean }> => {
    let events: AuditEvent[] = []
    let total = 0
    let seq = 0
    for (let pages = 0; pages < AUDIT_PAGES; pages++) {
      const q = [`since=${enc(since)}`, `limit=${AUDIT_PAGE}`]
      if (action !== '') q.push(`action=${enc(action)}`)
      if (seq > 0) q.push(`since_seq=${seq}`)
      const page = (await call<{ events: AuditEvent[] }>('GET', '/audit?' + q.join('&'))).events
      total += page.length
      events = events.concat(page).slice(-show)
      if (page.length < AUDIT_PAGE) return { events: events.reverse(), total, cut: false }
      seq = page[page.length - 1].seq
    }
    return { events: events.reverse(), total, cut: true }
  },
}

/** A message for the user from any error. */
export function message (err: unknown): string {
  if (err instanceof ApiError) return err.message
  if (err instanceof Error) return err.message
  return String(err)
}
