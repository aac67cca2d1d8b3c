// The error classes by code and status, as api/errors.go has them: no
// daemon needed.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { InsufficientStorageError, LoamError, UnavailableError, errorFromBody } from '@loam/sdk'

test('insufficient_storage: 507, its own class', () => {
  const body = JSON.stringify({ error: { code: 'insufficient_storage', message: 'not enough space in the data dir for a memory checkpoint of 1.2 GiB: 300 MiB free' } })
  const e = errorFromBody(507, body)
  assert.ok(e instanceof InsufficientStorageError)
  assert.equal(e.code, 'insufficient_storage')
  assert.equal(e.status, 507)
  assert.match(e.message, /300 MiB free/)
  // A 507 without the API's body still reads as its code.
  const bare = errorFromBody(507, 'Insufficient Storage')
  assert.ok(bare instanceof InsufficientStorageError)
  // And the classes stay apart.
  assert.ok(!(errorFromBody(503, '') instanceof InsufficientStorageError))
  assert.ok(errorFromBody(503, '') instanceof UnavailableError)
  assert.ok(e instanceof LoamError)
})
