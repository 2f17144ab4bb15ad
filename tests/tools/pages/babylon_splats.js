// A test page (tests/stages/test_splat_viewers.py): the GLB embedded in the page drawn by
// Babylon.js's own KHR_gaussian_splatting glTF extension (@babylonjs/loaders 9.28), as a user
// of Babylon.js would load it: AppendSceneAsync into a right-handed scene (glTF's axes, so
// the camera parameters mean what they mean for three.js), GaussianSplattingMesh objects on
// the WebGL 2 engine, the file's animation groups held at the requested time. Nothing of ours
// draws or poses a splat.
//
// The page and its parameters are those of three_splats.js (page_common.js); it logs
// "splat-viewer: ready viewer=babylon splats=<n> ..." when a frame is drawn.

import {
  AppendSceneAsync,
  Color4,
  Engine,
  Logger,
  Scene,
  SceneLoaderFlags,
  TargetCamera,
  Vector3,
} from "@babylonjs/core"; // the whole package, as an application imports it
import "@babylonjs/loaders/glTF/2.0"; // glTF 2.0 and its extensions, KHR_gaussian_splatting too
import { orbitPosition, params, readGlb } from "./page_common.js";

const MAX_YIELDS = 1e7;
const FPS = 60; // the glTF loader's targetFps: key times in seconds become frames at 60 fps

// Call done() until it returns true, yielding to the event loop by messages, not timers: with
// Chromium's --virtual-time-budget, an idle page waiting on a timer jumps virtual time to it,
// so polling by timers could spend the budget before the sorting worker answers; queued
// messages do not make it jump.
async function settle(done) {
  for (let i = 0; ; i++) {
    if (done()) return i;
    if (i > MAX_YIELDS) throw new Error("the scene did not settle (the splats' depth sort)");
    await new Promise((resolve) => {
      const channel = new MessageChannel();
      channel.port1.onmessage = resolve;
      channel.port2.postMessage(0);
    });
  }
}

async function main() {
  const { t, camera: orbit, fovy } = params();
  Logger.LogLevels = Logger.WarningLogLevel | Logger.ErrorLogLevel; // not the version banner
  // No loading screen: an overlay that fades out on timers could still cover the canvas when
  // the screenshot is taken.
  SceneLoaderFlags.ShowLoadingScreen = false;
  const canvas = document.createElement("canvas");
  canvas.style.width = "100vw";
  canvas.style.height = "100vh";
  document.body.appendChild(canvas);
  const engine = new Engine(canvas, false, { preserveDrawingBuffer: true, stencil: true });
  engine.resize(); // the drawing buffer at the canvas's size
  const scene = new Scene(engine);
  scene.useRightHandedSystem = true;
  scene.clearColor = new Color4(0xd4 / 255, 0xd8 / 255, 0xde / 255, 1);
  const { position, target, near, far } = orbitPosition(orbit);
  const camera = new TargetCamera("camera", new Vector3(...position), scene);
  camera.upVector = new Vector3(0, 1, 0);
  camera.setTarget(new Vector3(...target));
  camera.fov = (fovy * Math.PI) / 180; // vertical (Babylon's default fovMode)
  camera.minZ = near;
  camera.maxZ = far;

  await AppendSceneAsync(new Uint8Array(readGlb()), scene, {
    pluginExtension: ".glb",
    pluginOptions: { gltf: { animationStartMode: 0 } }, // NONE: the page sets the time
  });
  for (const group of scene.animationGroups) {
    group.start(false, 1.0, group.from, group.to);
    group.goToFrame(Math.min(t * FPS, group.to));
    group.pause();
  }
  const splatMeshes = scene.meshes.filter((m) => m.getClassName() === "GaussianSplattingMesh");
  const splats = splatMeshes.reduce((n, m) => n + m.splatCount, 0);
  // Babylon.js sorts the splats in a worker and draws a mesh only once a sort for the camera
  // has landed: render until the scene is ready and every sort has settled.
  const draw = () =>
    settle(() => {
      scene.render();
      return scene.isReady() && splatMeshes.every((m) => m._isDepthSortSettled);
    });
  window.addEventListener("resize", () => {
    engine.resize();
    draw().catch(fail);
  });
  const yields = await draw();
  const duration = Math.max(0, ...scene.animationGroups.map((g) => g.to / FPS));
  console.info(
    `splat-viewer: ready viewer=babylon splats=${splats} objects=${splatMeshes.length} ` +
      `clips=${scene.animationGroups.length} duration=${duration} t=${t} ` +
      `skeletons=${scene.skeletons.length} webgl=${engine.webGLVersion} yields=${yields} ` +
      `at=${performance.now().toFixed(0)}ms`,
  );
}

function fail(error) {
  console.error(`splat-viewer: ${error && error.stack ? error.stack : error}`);
}

main().catch(fail);
