import type { TestContext } from 'node:test'
import loam, { ConflictError, NotFoundError, type CreateSandbox, type Sandbox } from '@loam/sdk'

/** sandbox makes a sandbox for one test and deletes it when the test ends (unless the test did). */
export async function sandbox(t: TestContext, name: string, req: CreateSandbox = {}): Promise<Sandbox> {
  const sb = await loam.create({ name, ...req })
  t.after(async () => {
    // A sandbox busy with a checkpoint refuses a delete (409) for a moment.
    for (let i = 0; ; i++) {
      try {
        return await sb.delete()
      } catch (e) {
        if (e instanceof NotFoundError) return // the test deleted it itself
        if (!(e instanceof ConflictError) || i === 50) throw e
        await new Promise((r) => setTimeout(r, 200))
      }
    }
  })
  return sb
}

/** until polls f until it returns true, failing after ms. */
export async function until(what: string, f: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const end = Date.now() + ms
  while (!(await f())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

/** text decodes UTF-8. */
export const text = (b: Uint8Array): string => new TextDecoder().decode(b)
