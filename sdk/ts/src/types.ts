// Wire types of the loam API (Go package loam.dev/loam/api), with the JSON
// field names the API uses. Times are RFC 3339 strings.

/** A sandbox's state (api.State). */
export type State = 'creating' | 'running' | 'sleeping' | 'stopped' | 'error' | 'deleting' | 'restoring'

/** The limits a sandbox runs under. */
export interface Resources {
  cpus?: number
  memory_mib?: number
  disk_mib?: number
}

/**
 * The settings of a sandbox that may change while it lives (PATCH
 * /v1/sandboxes/{sandbox}); what is left out stays. labels replaces every
 * label.
 */
export interface UpdateSandbox {
  labels?: Record<string, string>
  idle?: string
  http_port?: number
  public?: boolean
}

/** What a sandbox may reach on the network; enforced on the host. */
export interface NetworkPolicy {
  /** 'all' (the default) or 'none'. */
  egress: 'all' | 'none' | ''
  /** IPv4 addresses or prefixes; Allow wins over Deny. */
  allow?: string[] | null
  deny?: string[] | null
}

/** The checkpoint a fork was made from. */
export interface ForkSource {
  sandbox: string
  checkpoint: string
}

/** A sandbox as the API shows it. */
export interface SandboxInfo {
  id: string
  name: string
  state: State
  /** Why it is in state error, and what brings it back; absent otherwise. */
  reason?: string
  template?: string
  image?: string
  resources: Resources
  env: Record<string, string> | null
  labels: Record<string, string> | null
  idle?: string
  http_port?: number
  url: string
  secrets?: Record<string, string>
  secret_files?: Record<string, string>
  public: boolean
  network: NetworkPolicy
  from?: ForkSource
  /** CPU and memory a running sandbox uses now (GET and the list only). */
  usage?: Usage
  created_at: string
}

/** What a running sandbox uses of the host now, read from its cgroup. */
export interface Usage {
  /** Host memory its cgroup holds, against resources.memory_mib. */
  memory_bytes: number
  /** CPU time used since its container started; two readings give cores. */
  cpu_seconds: number
}

/** A supervised command of a sandbox (api.Service). */
export interface Service {
  name: string
  cmd: string[]
  env?: Record<string, string>
  dir?: string
  user?: string
  /** 'always' (the default), 'on-failure' or 'never'. */
  restart?: 'always' | 'on-failure' | 'never' | ''
}

/** The body of a create (POST /v1/sandboxes). Every field is optional. */
export interface CreateSandbox {
  name?: string
  template?: string
  image?: string
  resources?: Resources
  env?: Record<string, string>
  labels?: Record<string, string>
  /** How long without activity before it sleeps: '10m', '0' for never. */
  idle?: string
  http_port?: number
  public?: boolean
  from?: ForkSource
  /** Environment variable → secret name. */
  secrets?: Record<string, string>
  /** Absolute path → secret name; files of mode 0400 owned by loam. */
  secret_files?: Record<string, string>
  network?: NetworkPolicy
  services?: Service[]
}

/** What a fork may give: all of a create but the template, image and resources, which come from the checkpoint. */
export type ForkOptions = Omit<CreateSandbox, 'from' | 'template' | 'image' | 'resources' | 'services'>

/** A root filesystem sandboxes are made from. */
export interface Template {
  name: string
  description: string
  default: boolean
  ready: boolean
  /** builtin, checkpoint or image (named by its ref; used with `image` on create). */
  kind: string
  /** pending, building, ready or failed. */
  state: string
  /** Why a failed template failed. */
  error?: string
  /** How far a build or pull has got, in percent (100 once ready). */
  progress: number
  /** A checkpoint template with memory starts its sandboxes running, like a fork. */
  memory: boolean
  size_bytes: number
  /** How many sandboxes use it. */
  uses: number
  /** The sandbox/checkpoint a checkpoint template was made from. */
  from?: string
  created_at?: string
}

/** An OCI image the daemon pulled (or is pulling). */
export interface Image {
  id: string
  ref: string
  digest?: string
  /** pulling, ready or error. */
  state: string
  error?: string
  /** Bytes to pull, and pulled so far. */
  size: number
  pulled: number
  config: { env?: string[]; working_dir?: string; user?: string; entrypoint?: string[]; cmd?: string[] }
  created_at: string
}

/** A registry the daemon holds credentials for (never the password). */
export interface Registry {
  registry: string
  username: string
}

/** The token that opens a private sandbox's URL, and the URL. */
export interface AccessToken {
  url: string
  access_token: string
}

/** A checkpoint as the API shows it. */
export interface Checkpoint {
  /** v1, v2, … (never reused) or auto-1, … for the automatic ones. */
  id: string
  sandbox: string
  name?: string
  comment: string
  memory: boolean
  auto: boolean
  /** True for one the sandbox took of itself from inside (a share apart from the owner's). */
  inside: boolean
  created_at: string
}

/** The body of a checkpoint create; memory is true when left out. */
export interface CreateCheckpoint {
  comment?: string
  memory?: boolean
  name?: string
}

/** An exec session (api.Session). */
export interface Session {
  id: string
  pid: number
  cmd: string[]
  tty: boolean
  detachable: boolean
  state: 'running' | 'exited'
  exit_code: number | null
  started_at: string
  exited_at: string | null
}

/** A service as the API shows it: its definition and how it is doing. */
export interface ServiceStatus extends Service {
  state: 'running' | 'backoff' | 'exited' | 'stopped'
  pid?: number
  restarts: number
  exit_code: number | null
  started_at: string | null
  error?: string
}

/** A file of a sandbox, as lstat sees it. */
export interface FileInfo {
  path: string
  type: 'file' | 'dir' | 'symlink' | 'other'
  size: number
  /** Permission bits in octal, '0644'. */
  mode: string
  mtime: string
  target?: string
  entries?: FileInfo[]
  truncated?: boolean
}

/** One event of a file watch. */
export interface WatchEvent {
  type: 'create' | 'write' | 'remove' | 'rename' | 'chmod' | 'overflow'
  path?: string
}

/** A TCP port something in a sandbox listens on. */
export interface Port {
  port: number
  addresses: string[]
  loopback: boolean
}

/** One event of a port watch. */
export interface PortEvent {
  type: 'open' | 'close'
  port: number
}

/** A secret: its name and times, never its value. */
export interface Secret {
  name: string
  created_at: string
  updated_at: string
}

/** The first message of an exec socket, and the body of a session start. */
export interface ExecRequest {
  cmd: string[]
  env?: Record<string, string>
  dir?: string
  user?: string
  tty?: boolean
  rows?: number
  cols?: number
  stdin?: boolean
  detachable?: boolean
  buffer_size?: number
}

/** A text message of an exec or attach socket. */
export interface ExecControl {
  type: 'resize' | 'eof' | 'signal' | 'started' | 'offset' | 'exit' | 'error'
  rows?: number
  cols?: number
  signal?: string
  pid?: number
  session?: string
  stream?: number
  offset?: number
  dropped?: number
  exit_code?: number
  error?: { code: string; message: string }
}

/** The largest message on a port stream, either way (api.MaxPortMessage). */
export const MAX_PORT_MESSAGE = 256 << 10

/** The subprotocol the server picks (api.WebSocketProtocol). */
export const WEBSOCKET_PROTOCOL = 'loam.v1'
/** The prefix of the subprotocol that carries the token (api.WebSocketTokenPrefix). */
export const WEBSOCKET_TOKEN_PREFIX = 'loam.token.'

/**
 * Pool is a warm pool: sandboxes kept made ahead of time from a checkpoint
 * (from) or a template, for forks and creates to claim.
 */
export interface Pool {
  from?: { sandbox: string; checkpoint: string }
  template?: string
  /** How many members the pool keeps; 0 is no pool. */
  size: number
  /** Members waiting to be claimed. */
  ready: number
  /** Members being made. */
  starting: number
  /** Host memory the ready members hold. */
  memory_bytes: number
  /** Forks and creates that took a member since the daemon started. */
  claimed: number
  /** Why the pool is below its size and not filling. */
  held?: string
}
