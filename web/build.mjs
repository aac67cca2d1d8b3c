// Builds the console into internal/console/dist (or the directory given as
// the first argument): index.html, assets/app.js and assets/app.css, with
// everything bundled in (no CDN: the page needs nothing but the daemon).
// The output is deterministic, so the committed bundle can be checked
// against a fresh build (TestConsole does).
import * as esbuild from 'esbuild'
import { copyFileSync, mkdirSync, rmSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const out = resolve(process.argv[2] ?? join(here, '..', 'internal', 'console', 'dist'))
rmSync(out, { recursive: true, force: true })
mkdirSync(join(out, 'assets'), { recursive: true })
await esbuild.build({
  entryPoints: { app: join(here, 'src', 'main.tsx') },
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['es2022'],
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: join(out, 'assets'),
  legalComments: 'linked',
  logLevel: 'warning',
})
copyFileSync(join(here, 'src', 'index.html'), join(out, 'index.html'))
