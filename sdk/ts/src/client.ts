import { LoamError, StreamEndedError, apiError } from './errors.js'
import { OffsetEvent, OutputChunk, Process, StdinSource } from './process.js'
import { EventStream, PortStream } from './streams.js'
import { CallOptions, Deadline, Endpoint, Query, Transport, concat, seg } from './transport.js'
import type {
  AccessToken,
  Image,
  Registry,
  Checkpoint,
  CreateCheckpoint,
  CreateSandbox,
  UpdateSandbox,
  ExecRequest,
  FileInfo,
  ForkList,
  ForkManyOptions,
  ForkOptions,
  NetworkPolicy,
  Port,
  PortEvent,
  SandboxInfo,
  Secret,
  Org,
  Quota,
  CreateKey,
  Key,
  AuditEvent,
  Service,
  ServiceStatus,
  Session,
  Pool,
  Template,
  WatchEvent,
} from './types.js'

/** One fork of Loam.forkMany: the name it was to have, and a handle on its sandbox or the error that kept it from being made. */
export interface Fork {
  /** `${name}-N`; undefined when the daemon named the fork. */
  name?: string
  sandbox?: Sandbox
  error?: LoamError
}

/** How to reach the API. Left out, each comes from the environment (LOAM_API_URL, LOAM_TOKEN). */
export interface LoamOptions {
  /** The API's URL, as http://127.0.0.1:7070. */
  url?: string
  /** The API token. */
  token?: string
  /**
   * How WebSockets carry the token: 'header' (Authorization, the default
   * on Node) or 'subprotocol' (loam.token.<token>, the default in
   * browsers, which cannot set headers on a WebSocket).
   */
  webSocketAuth?: 'header' | 'subprotocol'
}

/** The default URL when neither the options nor LOAM_API_URL give one. */
export const DEFAULT_URL = 'http://127.0.0.1:7070'

type Env = Record<string, string | undefined>

function env(): Env {
  return (globalThis as { process?: { env?: Env } }).process?.env ?? {}
}

/** Options of a command: what exec takes, besides the command. */
export interface ExecOptions extends CallOptions {
  env?: Record<string, string>
  /** The working directory; the user's home when empty. */
  dir?: string
  /** 'loam' (the default), 'root', or another user. */
  user?: string
  /** A terminal, of rows × cols; stdout and stderr are then one stream. */
  tty?: boolean
  rows?: number
  cols?: number
  /**
   * Stdin: data sent then closed, or true to write it yourself with
   * Process.write and closeStdin. Without it the command's stdin is empty.
   */
  stdin?: StdinSource | true
  /** A session that runs on when the socket closes, and can be attached to. */
  detachable?: boolean
  /** The size of each output buffer of a detachable session, in bytes. */
  bufferSize?: number
}

/** What run() resolves with. */
export interface RunResult {
  exitCode: number
  stdout: string
  stderr: string
}

/** Where an attach or a logs read starts, and whether it follows. */
export interface AttachOptions extends CallOptions {
  /** Where stdout's replay starts; everything still buffered when left out. */
  offset?: number
  /** Where stderr's starts; offset's when left out. */
  stderrOffset?: number
  /** false ends the stream once what was buffered is sent; true (the default for attach) follows live output. */
  follow?: boolean
  /** Called for each "offset" message. */
  onOffset?: (ev: OffsetEvent) => void
  /** Stdin for the session, as for exec. */
  stdin?: StdinSource | true
}

/** Options of the files calls. */
export interface FileOptions extends CallOptions {
  /** Who acts: 'loam' when left out, or 'root', or another user. */
  user?: string
}

/**
 * ReadOptions reads part of a file: `length` bytes from byte `offset` (to
 * the end when `length` is left out). A part past the end of the file reads
 * what there is of it, maybe nothing.
 */
export interface ReadOptions extends FileOptions {
  offset?: number
  length?: number
}

/**
 * Loam is a client of one loam daemon. `new Loam({ url, token })` names it;
 * `new Loam()` (and the package's default export) reads LOAM_API_URL and
 * LOAM_TOKEN when it is first used, so making one never throws.
 */
export class Loam {
  /** @internal */
  readonly t: Transport
  private ep?: Promise<Endpoint>

  constructor(opts: LoamOptions = {}) {
    this.t = new Transport(() => (this.ep ??= this.resolve(opts)).catch((e: unknown) => {
      this.ep = undefined
      throw e
    }))
  }

  private async resolve(opts: LoamOptions): Promise<Endpoint> {
    const e = env()
    const url = (opts.url ?? e.LOAM_API_URL ?? DEFAULT_URL).replace(/\/+$/, '')
    let token = opts.token ?? e.LOAM_TOKEN ?? ''
    if (!token && (globalThis as { process?: unknown }).process) {
      // On the daemon's machine, as the Go SDK and the CLI: its token file.
      try {
        const name = 'node:fs/promises'
        const fs = (await import(name)) as { readFile(path: string, enc: string): Promise<string> }
        token = (await fs.readFile((e.LOAM_DATA_DIR ?? '/var/lib/loam') + '/token', 'utf8')).trim()
      } catch {
        // fall through to the error below
      }
    }
    if (!token) throw apiError('unauthorized', 'no loam token: set LOAM_TOKEN or give new Loam({ token })')
    return { url, token, webSocketAuth: opts.webSocketAuth }
  }

  /** sandbox is a handle on a sandbox by name or id; it makes no call. */
  sandbox(ref: string): Sandbox {
    return new Sandbox(this, ref)
  }

  /** create makes a sandbox (every field of the body is optional) and returns a handle on it. */
  async create(req: CreateSandbox = {}, opts?: CallOptions): Promise<Sandbox> {
    const info = await this.t.json<SandboxInfo>('POST', '/v1/sandboxes', { ...opts, body: req })
    return new Sandbox(this, info.id, info)
  }

  /** list lists sandboxes, only those with every label given when labels are. */
  async list(opts: CallOptions & { labels?: Record<string, string> } = {}): Promise<SandboxInfo[]> {
    const label = Object.entries(opts.labels ?? {})
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([k, v]) => `${k}=${v}`)
    const r = await this.t.json<{ sandboxes: SandboxInfo[] | null }>('GET', '/v1/sandboxes', { ...opts, query: { label } })
    return r.sandboxes ?? []
  }

  /** get gets a sandbox by name or id. */
  get(ref: string, opts?: CallOptions): Promise<SandboxInfo> {
    return this.sandbox(ref).info(opts)
  }

  /** delete deletes a sandbox and its checkpoints. */
  delete(ref: string, opts?: CallOptions): Promise<void> {
    return this.sandbox(ref).delete(opts)
  }

  /**
   * fork makes a new, independent sandbox from a checkpoint of sandbox:
   * its disk, and its memory for a memory checkpoint. Template, image and
   * resources come from the checkpoint; network and secrets too unless given.
   */
  async fork(sandbox: string, checkpoint: string, req: ForkOptions = {}, opts?: CallOptions): Promise<Sandbox> {
    if (!sandbox || !checkpoint) throw new LoamError('invalid', 'a fork needs a sandbox and a checkpoint')
    return this.create({ ...req, from: { sandbox, checkpoint } }, opts)
  }

  /**
   * forkMany makes req.count forks (1 to 64) of a checkpoint of sandbox at
   * once, each as fork makes one (in a cluster, each placed on its own),
   * named `${name}-1` … `${name}-${count}` after req.name, or by the daemon
   * without one. It returns every fork in order, each with a handle on its
   * sandbox or the error that kept it from being made (its status 0: it
   * came in the list); when none was made it throws the first one's error.
   */
  async forkMany(sandbox: string, checkpoint: string, req: ForkManyOptions, opts?: CallOptions): Promise<Fork[]> {
    if (!sandbox || !checkpoint) throw new LoamError('invalid', 'a fork needs a sandbox and a checkpoint')
    const list = await this.t.json<ForkList>('POST', '/v1/sandboxes', { ...opts, body: { ...req, from: { sandbox, checkpoint } } })
    return list.forks.map((f) => ({
      name: f.name,
      sandbox: f.sandbox ? new Sandbox(this, f.sandbox.id, f.sandbox) : undefined,
      error: f.error ? apiError(f.error.code, f.error.message) : undefined,
    }))
  }

  /** openapi is the daemon's API document (OpenAPI 3.1, YAML). */
  async openapi(opts?: CallOptions): Promise<string> {
    const d = new Deadline(opts)
    try {
      const resp = await this.t.fetch('GET', '/v1/openapi.yaml', d)
      return await resp.text()
    } finally {
      d.done()
    }
  }

  /** templates lists the templates sandboxes can be made from. */
  async templates(opts?: CallOptions): Promise<Template[]> {
    return (await this.t.json<{ templates: Template[] | null }>('GET', '/v1/templates', opts)).templates ?? []
  }

  /** setSecret stores a secret (at most 64 KiB); sandboxes that use it get the new value when they next start. */
  setSecret(name: string, value: string, opts?: CallOptions): Promise<Secret> {
    return this.t.json<Secret>('PUT', `/v1/secrets/${seg('secret', name)}`, { ...opts, body: { value } })
  }

  /** secrets lists secrets, never their values. */
  async secrets(opts?: CallOptions): Promise<Secret[]> {
    return (await this.t.json<{ secrets: Secret[] | null }>('GET', '/v1/secrets', opts)).secrets ?? []
  }

  /** deleteSecret deletes a secret; one a sandbox uses only with force. */
  async deleteSecret(name: string, opts: CallOptions & { force?: boolean } = {}): Promise<void> {
    await this.t.json('DELETE', `/v1/secrets/${seg('secret', name)}`, { ...opts, query: { force: opts.force ? 'true' : undefined } })
  }

  // Templates made from checkpoints.

  /**
   * createTemplate keeps a checkpoint as template name, memory included when
   * it has some; it outlives the sandbox and the checkpoint.
   */
  createTemplate(name: string, from: { sandbox: string; checkpoint: string }, opts?: CallOptions & { pool?: number }): Promise<Template> {
    return this.t.json<Template>('POST', '/v1/templates', { ...opts, body: { name, from, pool: opts?.pool || undefined } })
  }

  /**
   * setTemplatePool keeps a warm pool of size sandboxes of a template (built
   * in, or made from a checkpoint): a create of it that asks for no other
   * CPUs or memory takes one and answers at once. 0 drains the pool.
   */
  setTemplatePool(name: string, size: number, opts?: CallOptions): Promise<Pool> {
    return this.t.json<Pool>('PUT', `/v1/templates/${seg('template', name)}/pool`, { ...opts, body: { size } })
  }

  /** templatePool reports a template's warm pool (size 0 when it has none). */
  templatePool(name: string, opts?: CallOptions): Promise<Pool> {
    return this.t.json<Pool>('GET', `/v1/templates/${seg('template', name)}/pool`, opts)
  }

  /** deleteTemplate deletes a checkpoint or image template no sandbox uses. */
  async deleteTemplate(name: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', `/v1/templates/${seg('template', name)}`, opts)
  }

  /** exportTemplate streams template name as one archive (zstd tar with a manifest and checksums). */
  async exportTemplate(name: string, opts?: CallOptions): Promise<ReadableStream<Uint8Array>> {
    const d = new Deadline(opts)
    let resp: Response
    try {
      resp = await this.t.fetch('GET', `/v1/templates/${seg('template', name)}/export`, d)
    } catch (e) {
      d.done()
      throw e
    }
    return bodyStream(resp, d, `exporting ${name}`)
  }

  /** importTemplate loads an exported archive as template name; a damaged one is refused (InvalidError). */
  async importTemplate(name: string, archive: Uint8Array | Blob | ReadableStream<Uint8Array>, opts?: CallOptions): Promise<Template> {
    const d = new Deadline(opts)
    try {
      const resp = await this.t.fetch('PUT', `/v1/templates/${seg('template', name)}/import`, d, { body: archive, contentType: 'application/zstd' })
      return (await resp.json()) as Template
    } finally {
      d.done()
    }
  }

  // Images.

  /** pullImage starts pulling an OCI image (a registry ref, OCI layout dir or docker save tarball); it answers at once. */
  pullImage(ref: string, opts?: CallOptions): Promise<Image> {
    return this.t.json<Image>('POST', '/v1/images', { ...opts, body: { ref } })
  }

  /** images lists the images. */
  async images(opts?: CallOptions): Promise<Image[]> {
    return (await this.t.json<{ images: Image[] | null }>('GET', '/v1/images', opts)).images ?? []
  }

  /** image gets one image, with its pull's progress in bytes. */
  image(id: string, opts?: CallOptions): Promise<Image> {
    return this.t.json<Image>('GET', `/v1/images/${seg('image', id)}`, opts)
  }

  /** deleteImage deletes an image no sandbox uses (ConflictError otherwise). */
  async deleteImage(id: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', `/v1/images/${seg('image', id)}`, opts)
  }

  /** loginRegistry stores credentials for a registry (sealed like secrets). */
  loginRegistry(registry: string, username: string, password: string, opts?: CallOptions): Promise<Registry> {
    return this.t.json<Registry>('PUT', `/v1/registries/${seg('registry', registry)}`, { ...opts, body: { username, password } })
  }

  /** registries lists the registries with stored credentials (never their passwords). */
  async registries(opts?: CallOptions): Promise<Registry[]> {
    return (await this.t.json<{ registries: Registry[] | null }>('GET', '/v1/registries', opts)).registries ?? []
  }

  /** logoutRegistry forgets a registry's credentials. */
  async logoutRegistry(registry: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', `/v1/registries/${seg('registry', registry)}`, opts)
  }

  /** createKey makes an API key of the caller's org; its secret is in this answer alone. */
  createKey(req: CreateKey, opts?: CallOptions): Promise<Key> {
    return this.t.json<Key>('POST', '/v1/keys', { ...opts, body: req })
  }

  /** keys lists the org's API keys, never their secrets. */
  async keys(opts?: CallOptions): Promise<Key[]> {
    return (await this.t.json<{ keys: Key[] | null }>('GET', '/v1/keys', opts)).keys ?? []
  }

  /** revokeKey revokes a key: its calls fail from now on, and its open streams end. */
  async revokeKey(id: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', `/v1/keys/${seg('key', id)}`, opts)
  }

  /** audit reads the audit log, oldest first. */
  async audit(
    filter: { since?: string; sinceSeq?: number; action?: string; org?: string; limit?: number } = {},
    opts?: CallOptions,
  ): Promise<AuditEvent[]> {
    const q = new URLSearchParams()
    if (filter.since) q.set('since', filter.since)
    if (filter.sinceSeq) q.set('since_seq', String(filter.sinceSeq))
    if (filter.action) q.set('action', filter.action)
    if (filter.org) q.set('org', filter.org)
    if (filter.limit) q.set('limit', String(filter.limit))
    const qs = q.toString()
    return (await this.t.json<{ events: AuditEvent[] | null }>('GET', '/v1/audit' + (qs ? '?' + qs : ''), opts)).events ?? []
  }

  /** org is the caller's org: its quota and what it uses now. */
  org(opts?: CallOptions): Promise<Org> {
    return this.t.json<Org>('GET', '/v1/org', opts)
  }

  /** orgs lists every org with its quota and use (the operator's: the admin token of loam serve). */
  async orgs(opts?: CallOptions): Promise<Org[]> {
    return (await this.t.json<{ orgs: Org[] | null }>('GET', '/v1/orgs', opts)).orgs ?? []
  }

  /** createOrg makes an org, with no quota and no keys (the operator's). */
  createOrg(name: string, opts?: CallOptions): Promise<Org> {
    return this.t.json<Org>('POST', '/v1/orgs', { ...opts, body: { name } })
  }

  /**
   * deleteOrg deletes an org and its keys (the operator's). An org that
   * still has sandboxes fails with ConflictError unless all is set: then
   * everything in it goes too.
   */
  async deleteOrg(org: string, opts: CallOptions & { all?: boolean } = {}): Promise<void> {
    await this.t.json('DELETE', `/v1/orgs/${seg('org', org)}`, { ...opts, query: { all: opts.all ? 'true' : undefined } })
  }

  /** createOrgKey makes a key of an org, as createKey does of the caller's (the operator's: an org's first key). */
  createOrgKey(org: string, req: CreateKey, opts?: CallOptions): Promise<Key> {
    return this.t.json<Key>('POST', `/v1/orgs/${seg('org', org)}/keys`, { ...opts, body: req })
  }

  /**
   * setQuota replaces an org's quota (a field left out is unlimited) and
   * returns the org (the operator's). A call past a limit then fails with
   * LimitError.
   */
  setQuota(org: string, quota: Quota, opts?: CallOptions): Promise<Org> {
    return this.t.json<Org>('PUT', `/v1/orgs/${seg('org', org)}/quota`, { ...opts, body: quota })
  }
}

/**
 * Sandbox is a handle on one sandbox, by name or id. Every method is one
 * call of the API on it.
 */
export class Sandbox {
  constructor(
    private readonly loam: Loam,
    /** The name or id the handle was made with (the id for create and fork). */
    readonly ref: string,
    /** The sandbox as the create or fork that made the handle answered; undefined for loam.sandbox(ref). */
    readonly created?: SandboxInfo,
  ) {}

  private path(rest = ''): string {
    return `/v1/sandboxes/${seg('sandbox', this.ref)}${rest}`
  }

  private get t(): Transport {
    return this.loam.t
  }

  // Sandbox itself.

  /** info gets the sandbox as the API shows it. */
  info(opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('GET', this.path(), opts)
  }

  /** delete deletes the sandbox and its checkpoints. */
  async delete(opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', this.path(), opts)
  }

  /**
   * update changes the sandbox's labels (replaced as a whole), idle time,
   * http_port or public URL, at once and without waking it.
   */
  update(changes: UpdateSandbox, opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('PATCH', this.path(), { ...opts, body: changes })
  }

  /** sleep puts the sandbox to sleep now (memory saved, no processes on the host). */
  sleep(opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('POST', this.path('/sleep'), opts)
  }

  /**
   * wake wakes a sleeping sandbox; one in state error (its `reason` says
   * why) is booted again on its disk, files kept, processes started afresh.
   */
  wake(opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('POST', this.path('/wake'), opts)
  }

  /** accessToken is the sandbox's URL and the token that opens it when it is private. */
  accessToken(opts?: CallOptions): Promise<AccessToken> {
    return this.t.json<AccessToken>('GET', this.path('/access-token'), opts)
  }

  /** network is the sandbox's network policy. */
  async network(opts?: CallOptions): Promise<NetworkPolicy> {
    return (await this.info(opts)).network
  }

  /** setNetwork replaces the network policy; connections it forbids are cut. */
  setNetwork(policy: NetworkPolicy, opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('PUT', this.path('/network'), { ...opts, body: policy })
  }

  // Checkpoints.

  /** createCheckpoint takes a checkpoint; memory is true unless given as false. */
  createCheckpoint(req: CreateCheckpoint = {}, opts?: CallOptions): Promise<Checkpoint> {
    return this.t.json<Checkpoint>('POST', this.path('/checkpoints'), { ...opts, body: req })
  }

  /** checkpoints lists the sandbox's checkpoints, oldest first. */
  async checkpoints(opts?: CallOptions): Promise<Checkpoint[]> {
    return (await this.t.json<{ checkpoints: Checkpoint[] | null }>('GET', this.path('/checkpoints'), opts)).checkpoints ?? []
  }

  /** getCheckpoint gets a checkpoint by id or name. */
  getCheckpoint(id: string, opts?: CallOptions): Promise<Checkpoint> {
    return this.t.json<Checkpoint>('GET', this.path(`/checkpoints/${seg('checkpoint', id)}`), opts)
  }

  /** deleteCheckpoint deletes a checkpoint. */
  async deleteCheckpoint(id: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', this.path(`/checkpoints/${seg('checkpoint', id)}`), opts)
  }

  /** restoreCheckpoint puts the sandbox back to a checkpoint, keeping its current state as auto-N first. */
  restoreCheckpoint(id: string, opts?: CallOptions): Promise<SandboxInfo> {
    return this.t.json<SandboxInfo>('POST', this.path(`/checkpoints/${seg('checkpoint', id)}/restore`), opts)
  }

  /**
   * setPool keeps a warm pool of size forks of a checkpoint of this sandbox,
   * restored ahead of time: a fork of it takes one and answers at once. 0
   * drains the pool; deleting the checkpoint does too.
   */
  setPool(checkpoint: string, size: number, opts?: CallOptions): Promise<Pool> {
    return this.t.json<Pool>('PUT', this.path(`/checkpoints/${seg('checkpoint', checkpoint)}/pool`), { ...opts, body: { size } })
  }

  /** pool reports the warm pool of a checkpoint of this sandbox (size 0 when it has none). */
  pool(checkpoint: string, opts?: CallOptions): Promise<Pool> {
    return this.t.json<Pool>('GET', this.path(`/checkpoints/${seg('checkpoint', checkpoint)}/pool`), opts)
  }

  /** fork makes a new sandbox from a checkpoint of this one (Loam.fork). */
  fork(checkpoint: string, req: ForkOptions = {}, opts?: CallOptions): Promise<Sandbox> {
    return this.loam.fork(this.ref, checkpoint, req, opts)
  }

  /** forkMany makes req.count sandboxes from a checkpoint of this one at once (Loam.forkMany). */
  forkMany(checkpoint: string, req: ForkManyOptions, opts?: CallOptions): Promise<Fork[]> {
    return this.loam.forkMany(this.ref, checkpoint, req, opts)
  }

  // Exec and sessions.

  /**
   * exec starts a command over a WebSocket and returns it as it runs:
   * iterate it for output, write() to its stdin, wait() for its exit code.
   * The call's signal and timeout bound the whole command.
   */
  async exec(cmd: string[], opts: ExecOptions = {}): Promise<Process> {
    if (cmd.length === 0 || !cmd[0]) throw new LoamError('invalid', 'no command given')
    const d = new Deadline(opts)
    try {
      const sock = await this.t.socket(this.path('/exec'), d)
      const req: ExecRequest = {
        cmd,
        env: opts.env,
        dir: opts.dir,
        user: opts.user,
        tty: opts.tty,
        rows: opts.rows,
        cols: opts.cols,
        stdin: opts.stdin !== undefined,
        detachable: opts.detachable,
        buffer_size: opts.bufferSize,
      }
      sock.send(JSON.stringify(req))
      const p = new Process(sock, d, { what: `running ${cmd[0]} in ${this.ref}` })
      if (opts.stdin !== undefined && opts.stdin !== true) p.pipe(opts.stdin).catch(() => undefined)
      return p
    } catch (e) {
      d.done()
      throw e
    }
  }

  /**
   * run runs a command to its end and resolves with its exit code and
   * output, decoded as UTF-8. A command that exits non-zero is no error.
   */
  async run(cmd: string[], opts: ExecOptions = {}): Promise<RunResult> {
    const p = await this.exec(cmd, opts)
    return collect(p)
  }

  /**
   * startSession starts a detachable session without a socket; attach to it
   * for its output. With stdin: true its stdin stays open for attaches to
   * write to; without, it is empty.
   */
  startSession(cmd: string[], opts: Omit<ExecOptions, 'stdin' | 'detachable'> & { stdin?: boolean } = {}): Promise<Session> {
    const req: ExecRequest = {
      cmd,
      env: opts.env,
      dir: opts.dir,
      user: opts.user,
      tty: opts.tty,
      rows: opts.rows,
      cols: opts.cols,
      stdin: opts.stdin,
      buffer_size: opts.bufferSize,
    }
    return this.t.json<Session>('POST', this.path('/sessions'), { ...opts, body: req })
  }

  /** sessions lists running sessions and the newest exited ones, oldest first. */
  async sessions(opts?: CallOptions): Promise<Session[]> {
    return (await this.t.json<{ sessions: Session[] | null }>('GET', this.path('/sessions'), opts)).sessions ?? []
  }

  /** getSession gets a session by id. */
  getSession(id: string, opts?: CallOptions): Promise<Session> {
    return this.t.json<Session>('GET', this.path(`/sessions/${seg('session', id)}`), opts)
  }

  /** waitSession resolves with the session once it has exited. */
  waitSession(id: string, opts?: CallOptions): Promise<Session> {
    return this.t.json<Session>('POST', this.path(`/sessions/${seg('session', id)}/wait`), opts)
  }

  /** signalSession sends a signal ('TERM', 'SIGINT', '9'…) to the session's process group. */
  async signalSession(id: string, signal: string, opts?: CallOptions): Promise<void> {
    await this.t.json('POST', this.path(`/sessions/${seg('session', id)}/signal`), { ...opts, body: { signal } })
  }

  /** deleteSession kills a running session and forgets it. */
  async deleteSession(id: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', this.path(`/sessions/${seg('session', id)}`), opts)
  }

  /**
   * attach attaches to a session: its output from offset (everything still
   * buffered when left out), then live output unless follow is false.
   * Closing the Process leaves the session running.
   */
  async attach(id: string, opts: AttachOptions = {}): Promise<Process> {
    const d = new Deadline(opts)
    try {
      const sock = await this.t.socket(this.path(`/sessions/${seg('session', id)}/attach`), d, attachQuery(opts, opts.follow ?? true))
      const p = new Process(sock, d, { what: `attaching to ${id} of ${this.ref}`, onOffset: opts.onOffset, noFollow: opts.follow === false })
      if (opts.stdin !== undefined && opts.stdin !== true) p.pipe(opts.stdin).catch(() => undefined)
      return p
    } catch (e) {
      d.done()
      throw e
    }
  }

  // Services.

  /** putService defines (or redefines) a service and starts it. */
  putService(def: Service, opts?: CallOptions): Promise<ServiceStatus> {
    return this.t.json<ServiceStatus>('PUT', this.path(`/services/${seg('service', def.name)}`), { ...opts, body: def })
  }

  /** services lists the sandbox's services, by name. */
  async services(opts?: CallOptions): Promise<ServiceStatus[]> {
    return (await this.t.json<{ services: ServiceStatus[] | null }>('GET', this.path('/services'), opts)).services ?? []
  }

  /** getService gets a service. */
  getService(name: string, opts?: CallOptions): Promise<ServiceStatus> {
    return this.t.json<ServiceStatus>('GET', this.path(`/services/${seg('service', name)}`), opts)
  }

  /** deleteService stops a service and removes its definition. */
  async deleteService(name: string, opts?: CallOptions): Promise<void> {
    await this.t.json('DELETE', this.path(`/services/${seg('service', name)}`), opts)
  }

  /** startService starts a stopped service. */
  startService(name: string, opts?: CallOptions): Promise<ServiceStatus> {
    return this.serviceAction(name, 'start', opts)
  }

  /** stopService stops a service until it is started. */
  stopService(name: string, opts?: CallOptions): Promise<ServiceStatus> {
    return this.serviceAction(name, 'stop', opts)
  }

  /** restartService stops and starts a service. */
  restartService(name: string, opts?: CallOptions): Promise<ServiceStatus> {
    return this.serviceAction(name, 'restart', opts)
  }

  private serviceAction(name: string, action: string, opts?: CallOptions): Promise<ServiceStatus> {
    return this.t.json<ServiceStatus>('POST', this.path(`/services/${seg('service', name)}/${action}`), opts)
  }

  /**
   * serviceLogs streams a service's output from offset: what is buffered,
   * then, with follow, live output until the call is aborted or the
   * iteration stopped.
   */
  async *serviceLogs(name: string, opts: Omit<AttachOptions, 'stdin'> = {}): AsyncGenerator<OutputChunk> {
    const d = new Deadline(opts)
    let p: Process | undefined
    try {
      const sock = await this.t.socket(this.path(`/services/${seg('service', name)}/logs`), d, attachQuery(opts, opts.follow ?? false))
      p = new Process(sock, d, { what: `reading logs of ${name} of ${this.ref}`, onOffset: opts.onOffset, noFollow: true })
      yield* p
    } finally {
      p?.close()
      d.done()
    }
  }

  // Files.

  private files(rest = ''): string {
    return this.path('/files' + rest)
  }

  /** stat describes path (lstat: a symlink is itself). */
  stat(path: string, opts: FileOptions = {}): Promise<FileInfo> {
    return this.t.json<FileInfo>('GET', this.files(), { ...opts, query: { path, user: opts.user, depth: 0 } })
  }

  /** listFiles describes path with a directory's entries, depth levels deep (1 by default). */
  listFiles(path: string, opts: FileOptions & { depth?: number } = {}): Promise<FileInfo> {
    return this.t.json<FileInfo>('GET', this.files(), { ...opts, query: { path, user: opts.user, depth: opts.depth } })
  }

  /**
   * readStream streams a file's bytes, or with `offset` and `length` a
   * part of them. The stream errors with StreamEndedError when the
   * transfer ends short (a checkpoint cut it).
   */
  async readStream(path: string, opts: ReadOptions = {}): Promise<ReadableStream<Uint8Array>> {
    return this.download('/content', path, opts, { offset: opts.offset, length: opts.length })
  }

  /** readFile reads a whole file, or with `offset` and `length` a part of it. */
  async readFile(path: string, opts: ReadOptions = {}): Promise<Uint8Array> {
    return readAll(await this.readStream(path, opts))
  }

  /** readText reads a whole file as UTF-8 text, or with `offset` and `length` a part of it. */
  async readText(path: string, opts: ReadOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readFile(path, opts))
  }

  /** writeFile writes data to path atomically, making its parents; mode is octal ('0644'). */
  async writeFile(
    path: string,
    data: string | Uint8Array | Blob | ReadableStream<Uint8Array>,
    opts: FileOptions & { mode?: string } = {},
  ): Promise<FileInfo> {
    const d = new Deadline(opts)
    try {
      const body = typeof data === 'string' ? new TextEncoder().encode(data) : data
      const resp = await this.t.fetch('PUT', this.files('/content'), d, { query: { path, user: opts.user, mode: opts.mode }, body })
      return (await resp.json()) as FileInfo
    } finally {
      d.done()
    }
  }

  /** mkdir makes a directory and its parents (as mkdir -p); mode is octal, '0755' by default. */
  mkdir(path: string, opts: FileOptions & { mode?: string } = {}): Promise<FileInfo> {
    return this.t.json<FileInfo>('POST', this.files('/mkdir'), { ...opts, body: { path, mode: opts.mode, user: opts.user } })
  }

  /** move renames from to to, replacing a file at to. */
  move(from: string, to: string, opts: FileOptions = {}): Promise<FileInfo> {
    return this.t.json<FileInfo>('POST', this.files('/move'), { ...opts, body: { from, to, user: opts.user } })
  }

  /** remove removes path; a non-empty directory only with recursive. */
  async remove(path: string, opts: FileOptions & { recursive?: boolean } = {}): Promise<void> {
    await this.t.json('DELETE', this.files(), { ...opts, query: { path, user: opts.user, recursive: opts.recursive ? 'true' : undefined } })
  }

  /** downloadArchive streams a tar of directory dir. */
  downloadArchive(dir: string, opts: FileOptions = {}): Promise<ReadableStream<Uint8Array>> {
    return this.download('/archive', dir, opts)
  }

  /** uploadArchive extracts a tar into directory dir; entries that would land outside it are refused. */
  async uploadArchive(dir: string, tar: Uint8Array | Blob | ReadableStream<Uint8Array>, opts: FileOptions = {}): Promise<void> {
    const d = new Deadline(opts)
    try {
      const resp = await this.t.fetch('PUT', this.files('/archive'), d, { query: { path: dir, user: opts.user }, body: tar, contentType: 'application/x-tar' })
      await resp.arrayBuffer()
    } finally {
      d.done()
    }
  }

  /** watch watches path (a directory's entries, or with recursive its tree) for changes. */
  async watch(path: string, opts: FileOptions & { recursive?: boolean } = {}): Promise<EventStream<WatchEvent>> {
    const d = new Deadline(opts)
    try {
      const sock = await this.t.socket(this.files('/watch'), d, { path, user: opts.user, recursive: opts.recursive ? 'true' : undefined })
      return new EventStream<WatchEvent>(sock, d, `watching ${path}`)
    } catch (e) {
      d.done()
      throw e
    }
  }

  private async download(rest: string, path: string, opts: FileOptions, more: Query = {}): Promise<ReadableStream<Uint8Array>> {
    const d = new Deadline(opts)
    let resp: Response
    try {
      resp = await this.t.fetch('GET', this.files(rest), d, { query: { path, user: opts.user, ...more } })
    } catch (e) {
      d.done()
      throw e
    }
    return bodyStream(resp, d, `reading ${path}`)
  }

  // Ports.

  /** ports lists the TCP ports programs in the sandbox listen on. */
  async ports(opts?: CallOptions): Promise<Port[]> {
    return (await this.t.json<{ ports: Port[] | null }>('GET', this.path('/ports'), opts)).ports ?? []
  }

  /** watchPorts streams an event for every port that starts or stops listening, open events for those listening first. */
  async watchPorts(opts: CallOptions = {}): Promise<EventStream<PortEvent>> {
    const d = new Deadline(opts)
    try {
      return new EventStream<PortEvent>(await this.t.socket(this.path('/ports/watch'), d), d, `watching the ports of ${this.ref}`)
    } catch (e) {
      d.done()
      throw e
    }
  }

  /** connect opens one TCP connection to port inside the sandbox. */
  async connect(port: number, opts: CallOptions = {}): Promise<PortStream> {
    const d = new Deadline(opts)
    try {
      return new PortStream(await this.t.socket(this.path(`/ports/${seg('port', String(port))}/stream`), d), d)
    } catch (e) {
      d.done()
      throw e
    }
  }
}

function attachQuery(o: AttachOptions, follow: boolean): Record<string, string | number | undefined> {
  return { offset: o.offset, stderr_offset: o.stderrOffset, follow: follow ? undefined : 'false' }
}

/** collect reads a process to its end into a RunResult. */
async function collect(p: Process): Promise<RunResult> {
  const out: Uint8Array[] = []
  const err: Uint8Array[] = []
  for await (const c of p) (c.stream === 'stderr' ? err : out).push(c.data)
  const exitCode = await p.wait()
  const dec = new TextDecoder()
  return { exitCode: exitCode ?? -1, stdout: dec.decode(concat(out)), stderr: dec.decode(concat(err)) }
}

async function readAll(s: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = []
  const r = s.getReader()
  for (;;) {
    const { done, value } = await r.read()
    if (done) return concat(parts)
    parts.push(value)
  }
}

/**
 * bodyStream is the body of resp as a stream that ends d when it ends, and
 * errs with StreamEndedError (what names the transfer) when the transfer
 * ends early: short of its Content-Length, or cut.
 */
function bodyStream(resp: Response, d: Deadline, what: string): ReadableStream<Uint8Array> {
  const body = resp.body
  if (!body) {
    d.done()
    return new ReadableStream({ start: (c) => c.close() })
  }
  const want = Number(resp.headers.get('Content-Length') ?? -1)
  let got = 0
  const reader = body.getReader()
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      try {
        const { done, value } = await reader.read()
        if (done) {
          d.done()
          if (want >= 0 && got < want) c.error(new StreamEndedError(`${what}: the transfer ended early (${want - got} bytes missing)`, 1006))
          else c.close()
          return
        }
        got += value.length
        c.enqueue(value)
      } catch (e) {
        d.done()
        c.error(d.signal.aborted ? d.signal.reason : new StreamEndedError(`${what}: the transfer ended early: ${(e as Error).message}`, 1006))
      }
    },
    cancel(reason) {
      d.done()
      return reader.cancel(reason)
    },
  })
}
