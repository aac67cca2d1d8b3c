import type { components } from './generated/openapi.js'

/**
 * The API's error codes (api/errors.go; schema ErrorCode of the OpenAPI
 * document). The strings never change.
 */
export type ErrorCode = components['schemas']['ErrorCode']

/**
 * LoamError is every error the API answers with: `code` is the API's code
 * (one of {@link ErrorCode}), `status` the HTTP status it came with (0 when
 * it did not come as an HTTP answer, as on a WebSocket), `message` the
 * API's message. Subclasses name the classes a program is most likely to
 * handle; test with `instanceof`.
 */
export class LoamError extends Error {
  readonly code: ErrorCode | 'stream_ended'
  readonly status: number

  constructor(code: ErrorCode | 'stream_ended', message: string, status = 0) {
    super(message)
    this.name = new.target.name
    this.code = code
    this.status = status
  }
}

/** 404 not_found: the sandbox, checkpoint, session, file… does not exist. */
export class NotFoundError extends LoamError {}
/** 400 invalid: the request was wrong; the message names the field. */
export class InvalidError extends LoamError {}
/** 409 conflict: the thing is in a state that refuses the call (a name taken, a sandbox asleep…). */
export class ConflictError extends LoamError {}
/** 409 or 429 limit: a limit was reached (checkpoints, sandboxes, rates). */
export class LimitError extends LoamError {}
/** 401 unauthorized: no token, or the wrong one. */
export class UnauthorizedError extends LoamError {}
/** 403 forbidden: a valid token that may not do this. */
export class ForbiddenError extends LoamError {}
/** 503 unavailable: the daemon or the sandbox cannot answer now. */
export class UnavailableError extends LoamError {}
/**
 * 507 insufficient_storage: the daemon's data dir has no room for the work
 * (a memory checkpoint, a fork, an upload, an image pull); free space on
 * the host and call again. A sandbox's own full disk is a ConflictError.
 */
export class InsufficientStorageError extends LoamError {}

/**
 * StreamEndedError: a WebSocket stream (exec, attach, logs, watch, port)
 * ended before it was done, for a reason other than a checkpoint or restore
 * (the connection dropped, the daemon stopped).
 */
export class StreamEndedError extends LoamError {
  /** The WebSocket close code, 1006 when the connection just dropped. */
  readonly closeCode: number

  constructor(message: string, closeCode: number) {
    super('stream_ended', message)
    this.closeCode = closeCode
  }
}

/**
 * StreamInterruptedError: the stream was ended by a memory checkpoint or a
 * restore of the sandbox (WebSocket close code 1011). A detachable session
 * runs on through it and can be attached again; other commands got SIGHUP.
 */
export class StreamInterruptedError extends LoamError {
  /** Always 1011. */
  readonly closeCode = 1011

  constructor(message: string) {
    super('unavailable', message)
  }
}

const classes: Partial<Record<string, new (code: ErrorCode, message: string, status: number) => LoamError>> = {
  not_found: NotFoundError,
  invalid: InvalidError,
  conflict: ConflictError,
  limit: LimitError,
  unauthorized: UnauthorizedError,
  forbidden: ForbiddenError,
  unavailable: UnavailableError,
  insufficient_storage: InsufficientStorageError,
}

/** apiError makes the LoamError (of the right subclass) for an API error. */
export function apiError(code: string, message: string, status = 0): LoamError {
  const cls = classes[code] ?? LoamError
  return new cls(code as ErrorCode, message || code, status)
}

/** codeForStatus guesses the code of an answer that carried no error body (api.CodeForStatus). */
export function codeForStatus(status: number): ErrorCode {
  switch (status) {
    case 400:
    case 413:
      return 'invalid'
    case 401:
      return 'unauthorized'
    case 403:
      return 'forbidden'
    case 404:
      return 'not_found'
    case 405:
      return 'method_not_allowed'
    case 409:
      return 'conflict'
    case 426:
      return 'upgrade_required'
    case 429:
      return 'limit'
    case 503:
      return 'unavailable'
    case 507:
      return 'insufficient_storage'
    default:
      return 'internal'
  }
}

/** errorFromResponse reads an error answer's body {"error":{"code","message"}}. */
export async function errorFromResponse(resp: Response): Promise<LoamError> {
  let text = ''
  try {
    text = await resp.text()
  } catch {
    // The body is only a better message; the status still says what happened.
  }
  return errorFromBody(resp.status, text)
}

/** errorFromBody is errorFromResponse for a body already read. */
export function errorFromBody(status: number, text: string): LoamError {
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string } }
    if (body.error?.code) return apiError(body.error.code, body.error.message ?? '', status)
  } catch {
    // Not the API's JSON: a proxy's answer, say.
  }
  return apiError(codeForStatus(status), text.trim() || `HTTP status ${status}`, status)
}
