// The splat player: draws dynamic_splats.glb (KHR_gaussian_splatting POINTS primitives,
// skinned on joints or morphed; docs/outputs.md, "dynamic_splats.glb") as sorted Gaussian splats.
//
// GLTFLoader builds the joints and the animation (three.js ignores the splat attributes);
// this file reads the splat accessors itself, poses every Gaussian on the CPU at the mixer's
// time (skinned: positions by glTF's skinning rule, rotations by our convention q =
// N(Σ w_i q_j) ⊗ q_rest, scales unchanged; otherwise morphed, then placed by the node's world
// transform, as KHR_gaussian_splatting says), sorts them back to front and draws one quad each. The shader
// follows gsplat's conventions as chord.render.torch_backend does: EWA projection with the
// Jacobian clamped to 1.3x the frustum, Σ2D + 0.3·I with the opacity compensated
// (antialiased mode), alpha = min(0.999, o·exp(−σ)) kept from 1/255, the box
// floor(m − r)..ceil(m + r) with r = ceil(min(3.33, sqrt(2 ln(255·o)))·σ) per axis, pixel
// centres at +0.5, composited over the background with premultiplied "over".

import {
  Box3,
  BufferAttribute,
  CustomBlending,
  DoubleSide,
  GLSL3,
  InstancedBufferAttribute,
  InstancedBufferGeometry,
  Matrix4,
  Mesh,
  OneFactor,
  OneMinusSrcAlphaFactor,
  Quaternion,
  ShaderMaterial,
  Vector2,
  Vector3,
} from "three";

const EXT = "KHR_gaussian_splatting";
const SH_C0 = 0.28209479177387814;

// A primitive's accessor as a typed array (tightly packed: the writer's layout).
async function accessor(parser, index) {
  return (await parser.getDependency("accessor", index)).array;
}

// One splat object of the file: rest values and how it moves.
async function loadObject(parser, nodeIndex) {
  const json = parser.json;
  const nodeDef = json.nodes[nodeIndex];
  const [prim, ...more] = json.meshes[nodeDef.mesh].primitives;
  if (more.length || prim.mode !== 0 || !(prim.extensions && prim.extensions[EXT])) return null;
  const a = prim.attributes;
  const need = ["POSITION", `${EXT}:ROTATION`, `${EXT}:SCALE`, `${EXT}:OPACITY`];
  for (const name of need) {
    if (a[name] === undefined) throw new Error(`node ${nodeDef.name}: no ${name} attribute`);
  }
  const obj = {
    name: nodeDef.name,
    position: await accessor(parser, a.POSITION),
    rotation: await accessor(parser, a[`${EXT}:ROTATION`]), // x, y, z, w
    scale: await accessor(parser, a[`${EXT}:SCALE`]),
    opacity: await accessor(parser, a[`${EXT}:OPACITY`]),
    sh: [], // per basis k = l² + n: [count, 3]
  };
  obj.count = obj.opacity.length;
  for (let l = 0; ; l++) {
    const coefs = [];
    for (let n = 0; n <= 2 * l; n++) {
      const index = a[`${EXT}:SH_DEGREE_${l}_COEF_${n}`];
      if (index === undefined) break;
      coefs.push(await accessor(parser, index));
    }
    if (coefs.length !== 2 * l + 1) break;
    obj.sh.push(...coefs);
  }
  if (!obj.sh.length) throw new Error(`node ${nodeDef.name}: no SH_DEGREE_0_COEF_0 attribute`);
  if (nodeDef.skin !== undefined) {
    const skin = json.skins[nodeDef.skin];
    obj.joints = await Promise.all(skin.joints.map((j) => parser.getDependency("node", j)));
    const ibm = await accessor(parser, skin.inverseBindMatrices);
    obj.bind = obj.joints.map((_, j) => new Matrix4().fromArray(ibm, 16 * j));
    obj.jointIndex = await accessor(parser, a.JOINTS_0);
    obj.weight = await accessor(parser, a.WEIGHTS_0);
  } else {
    // its world transform places the splats (the writer puts it at the object's centre); it
    // holds the morph weights
    obj.node = await parser.getDependency("node", nodeIndex);
    obj.targets = await Promise.all(
      (prim.targets || []).map(async (t) => ({
        position: await accessor(parser, t.POSITION),
        rotation: await accessor(parser, t[`${EXT}:ROTATION`]),
      })),
    );
  }
  return obj;
}

// The splat objects of the scene's nodes (the file's scene 0 roots, and any below them).
export async function loadSplats(gltf) {
  const parser = gltf.parser;
  const json = parser.json;
  const objects = [];
  const visit = async (index) => {
    const nodeDef = json.nodes[index];
    if (nodeDef.mesh !== undefined) {
      const obj = await loadObject(parser, index);
      if (obj) objects.push(obj);
    }
    for (const child of nodeDef.children || []) await visit(child);
  };
  for (const index of json.scenes[json.scene || 0].nodes) await visit(index);
  if (!objects.length) throw new Error(`no ${EXT} primitive in the file`);
  return objects;
}

// Hamilton product a ⊗ b of quaternions stored x, y, z, w; into out at o.
function hamilton(ax, ay, az, aw, b, i, out, o) {
  const bx = b[i],
    by = b[i + 1],
    bz = b[i + 2],
    bw = b[i + 3];
  out[o] = aw * bx + ax * bw + ay * bz - az * by;
  out[o + 1] = aw * by - ax * bz + ay * bw + az * bx;
  out[o + 2] = aw * bz + ax * by - ay * bx + az * bw;
  out[o + 3] = aw * bw - ax * bx - ay * by - az * bz;
}

// Pose every Gaussian at the mixer's current time (the caller updated the nodes' world
// matrices): world positions [N, 3], unit rotations [N, 4] (x, y, z, w) and scale factors [N]
// into `pose`. A node's world transform moves, turns and scales its splats (a non-uniform
// scale by its geometric mean: a splat stays an ellipsoid of its own axes).
export function posed(objects, pose) {
  let g = 0;
  const m = new Matrix4();
  const at = new Vector3(),
    turn = new Quaternion(),
    size = new Vector3(),
    local = new Float32Array(4);
  for (const obj of objects) {
    const { count, position: p, rotation: r } = obj;
    const P = pose.position,
      R = pose.rotation;
    if (obj.joints) {
      const mats = obj.joints.map((bone, j) =>
        m.multiplyMatrices(bone.matrixWorld, obj.bind[j]).elements.slice(),
      );
      const quats = obj.joints.map((bone) => bone.quaternion); // local, rest = identity
      for (let i = 0; i < count; i++, g++) {
        let x = 0,
          y = 0,
          z = 0,
          qx = 0,
          qy = 0,
          qz = 0,
          qw = 0;
        const px = p[3 * i],
          py = p[3 * i + 1],
          pz = p[3 * i + 2];
        for (let k = 0; k < 4; k++) {
          const w = obj.weight[4 * i + k];
          if (w === 0) continue;
          const j = obj.jointIndex[4 * i + k];
          const e = mats[j]; // column-major J·IBM
          x += w * (e[0] * px + e[4] * py + e[8] * pz + e[12]);
          y += w * (e[1] * px + e[5] * py + e[9] * pz + e[13]);
          z += w * (e[2] * px + e[6] * py + e[10] * pz + e[14]);
          const q = quats[j];
          qx += w * q.x;
          qy += w * q.y;
          qz += w * q.z;
          qw += w * q.w; // a plain sum, no hemisphere flip (keys share one hemisphere)
        }
        const n = Math.hypot(qx, qy, qz, qw);
        P[3 * g] = x;
        P[3 * g + 1] = y;
        P[3 * g + 2] = z;
        hamilton(qx / n, qy / n, qz / n, qw / n, r, 4 * i, R, 4 * g);
        pose.factor[g] = 1; // the skin matrices are rigid
      }
    } else {
      const weights = obj.targets.length ? obj.node.morphTargetInfluences : [];
      const e = obj.node.matrixWorld.elements; // column-major
      obj.node.matrixWorld.decompose(at, turn, size);
      const factor = Math.cbrt(Math.abs(size.x * size.y * size.z));
      for (let i = 0; i < count; i++, g++) {
        const v = [p[3 * i], p[3 * i + 1], p[3 * i + 2], r[4 * i], r[4 * i + 1], r[4 * i + 2]];
        v.push(r[4 * i + 3]);
        weights.forEach((w, k) => {
          if (w === 0) return;
          const t = obj.targets[k];
          for (let c = 0; c < 3; c++) v[c] += w * t.position[3 * i + c];
          for (let c = 0; c < 4; c++) v[3 + c] += w * t.rotation[4 * i + c];
        });
        const n = Math.hypot(v[3], v[4], v[5], v[6]);
        for (let c = 0; c < 3; c++) {
          P[3 * g + c] = e[c] * v[0] + e[4 + c] * v[1] + e[8 + c] * v[2] + e[12 + c];
        }
        for (let c = 0; c < 4; c++) local[c] = v[3 + c] / n;
        hamilton(turn.x, turn.y, turn.z, turn.w, local, 0, R, 4 * g);
        pose.factor[g] = factor;
      }
    }
  }
}

// gsplat's real SH basis (Sloan's order, chord.render.sh) at unit direction (x, y, z): the
// first `count` values into out.
function shBasis(x, y, z, count, out) {
  out[0] = SH_C0;
  if (count <= 1) return;
  out[1] = -0.48860251190292 * y;
  out[2] = 0.48860251190292 * z;
  out[3] = -0.48860251190292 * x;
  if (count <= 4) return;
  const z2 = z * z,
    c1 = x * x - y * y,
    s1 = 2 * x * y;
  out[4] = 0.5462742152960395 * s1;
  out[5] = -1.092548430592079 * z * y;
  out[6] = 0.9461746957575601 * z2 - 0.3153915652525201;
  out[7] = -1.092548430592079 * z * x;
  out[8] = 0.5462742152960395 * c1;
  if (count <= 9) return;
  const tc = -2.285228997322329 * z2 + 0.4570457994644658,
    tb = 1.445305721320277 * z,
    c2 = x * c1 - y * s1,
    s2 = x * s1 + y * c1;
  out[9] = -0.5900435899266435 * s2;
  out[10] = tb * s1;
  out[11] = tc * y;
  out[12] = z * (1.865881662950577 * z2 - 1.119528997770346);
  out[13] = tc * x;
  out[14] = tb * c1;
  out[15] = -0.5900435899266435 * c2;
}

const VERTEX = /* glsl */ `
in vec3 center;
in vec3 covA; // Σxx, Σxy, Σxz (world)
in vec3 covB; // Σyy, Σyz, Σzz
in vec4 rgba; // colour, opacity
uniform vec2 focal; // fx, fy in drawing-buffer pixels
uniform vec2 viewport; // width, height in drawing-buffer pixels
out vec4 vColour;
out vec2 vMean; // the 2D mean, pixels from the top left
out vec3 vConic;
const float NEAR = 0.01;
const float EPS2D = 0.3;
void main() {
  // camera space as OpenCV's (x right, y down, z ahead): three's view with y and z flipped
  vec3 c = (viewMatrix * vec4(center, 1.0)).xyz * vec3(1.0, -1.0, -1.0);
  gl_Position = vec4(0.0, 0.0, 2.0, 1.0); // culled unless drawn below
  if (c.z <= NEAR) return;
  mat3 V = mat3(viewMatrix);
  vec3 r0 = vec3(V[0][0], V[1][0], V[2][0]); // rows of the rotation, flipped as above
  vec3 r1 = -vec3(V[0][1], V[1][1], V[2][1]);
  vec3 r2 = -vec3(V[0][2], V[1][2], V[2][2]);
  vec2 half_ = 0.5 * viewport; // the principal point
  vec2 lim = half_ / focal * 1.3; // |x/z|, |y/z| clamped to 1.3x the frustum
  float tx = c.z * clamp(c.x / c.z, -lim.x, lim.x);
  float ty = c.z * clamp(c.y / c.z, -lim.y, lim.y);
  vec3 j0 = focal.x / c.z * r0 - focal.x * tx / (c.z * c.z) * r2; // rows of J·R
  vec3 j1 = focal.y / c.z * r1 - focal.y * ty / (c.z * c.z) * r2;
  mat3 S = mat3(covA.x, covA.y, covA.z, covA.y, covB.x, covB.y, covA.z, covB.y, covB.z);
  float a = dot(j0, S * j0), b = dot(j0, S * j1), d = dot(j1, S * j1);
  float detOrig = a * d - b * b;
  a += EPS2D;
  d += EPS2D;
  float det = a * d - b * b;
  if (det <= 0.0) return;
  float o = rgba.a * sqrt(max(detOrig / det, 0.0));
  if (o < 1.0 / 255.0) return;
  vec2 mean = focal * c.xy / c.z + half_;
  float extend = min(3.33, sqrt(2.0 * log(o * 255.0)));
  vec2 r = ceil(extend * sqrt(vec2(a, d)));
  vec2 lo = floor(mean - r), hi = ceil(mean + r);
  vec2 px = mix(lo, hi, position.xy); // the quad's corner, pixels from the top left
  gl_Position = vec4(2.0 * px.x / viewport.x - 1.0, 1.0 - 2.0 * px.y / viewport.y, 0.0, 1.0);
  vColour = vec4(rgba.rgb, o);
  vMean = mean;
  vConic = vec3(d, -b, a) / det;
}
`;

const FRAGMENT = /* glsl */ `
precision highp float;
in vec4 vColour;
in vec2 vMean;
in vec3 vConic;
uniform vec2 viewport;
out vec4 colour;
void main() {
  vec2 d = vMean - vec2(gl_FragCoord.x, viewport.y - gl_FragCoord.y); // from the pixel centre
  float sigma = 0.5 * (vConic.x * d.x * d.x + vConic.z * d.y * d.y) + vConic.y * d.x * d.y;
  float alpha = min(0.999, vColour.a * exp(-sigma));
  if (sigma < 0.0 || alpha < 1.0 / 255.0) discard;
  colour = vec4(vColour.rgb * alpha, alpha); // premultiplied, over what is behind
}
`;

// The splats as one instanced three.js mesh; update(camera) poses, colours and sorts them.
export function splatMesh(objects) {
  const N = objects.reduce((n, obj) => n + obj.count, 0);
  const bases = Math.min(...objects.map((obj) => obj.sh.length));
  if (bases > 16) console.warn(`chord-viewer: SH above degree 3 is drawn as degree 3`);
  const pose = { position: new Float32Array(3 * N), rotation: new Float32Array(4 * N) };
  pose.factor = new Float32Array(N);
  const rest = { scale: new Float32Array(3 * N), opacity: new Float32Array(N), sh: [] };
  for (let k = 0; k < Math.min(bases, 16); k++) rest.sh.push(new Float32Array(3 * N));
  let g = 0;
  for (const obj of objects) {
    rest.scale.set(obj.scale, 3 * g);
    rest.opacity.set(obj.opacity, g);
    rest.sh.forEach((out, k) => out.set(obj.sh[k], 3 * g));
    g += obj.count;
  }

  const geometry = new InstancedBufferGeometry();
  const quad = new Float32Array([0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1, 0]);
  geometry.setAttribute("position", new BufferAttribute(quad, 3));
  geometry.setIndex([0, 1, 2, 2, 1, 3]);
  const attr = (name, size) => {
    const a = new InstancedBufferAttribute(new Float32Array(size * N), size);
    geometry.setAttribute(name, a);
    return a.array;
  };
  const out = { center: attr("center", 3), covA: attr("covA", 3), covB: attr("covB", 3) };
  out.rgba = attr("rgba", 4);
  geometry.instanceCount = N;
  const material = new ShaderMaterial({
    glslVersion: GLSL3,
    vertexShader: VERTEX,
    fragmentShader: FRAGMENT,
    uniforms: { focal: { value: new Vector2() }, viewport: { value: new Vector2() } },
    transparent: true,
    side: DoubleSide, // the corners' winding flips with the pixel rows' direction
    depthTest: false,
    depthWrite: false,
    blending: CustomBlending,
    blendSrc: OneFactor,
    blendDst: OneMinusSrcAlphaFactor,
    blendSrcAlpha: OneFactor,
    blendDstAlpha: OneMinusSrcAlphaFactor,
  });
  const mesh = new Mesh(geometry, material);
  mesh.frustumCulled = false;

  const order = new Uint32Array(N);
  const depth = new Float32Array(N);
  const basis = new Float32Array(16);
  const eye = new Vector3();
  const ahead = new Vector3();
  const bounds = () => {
    posed(objects, pose); // at the current joints
    return new Box3().setFromArray(pose.position);
  };

  // Pose at the current joints (see posed), then per camera: colours (SH at the direction
  // from the camera), the back-to-front order by view depth, the instance arrays.
  const update = (camera, renderer) => {
    posed(objects, pose);
    camera.updateMatrixWorld();
    eye.setFromMatrixPosition(camera.matrixWorld);
    camera.getWorldDirection(ahead);
    const P = pose.position,
      Q = pose.rotation;
    for (let i = 0; i < N; i++) {
      order[i] = i;
      depth[i] = (P[3 * i] - eye.x) * ahead.x + (P[3 * i + 1] - eye.y) * ahead.y;
      depth[i] += (P[3 * i + 2] - eye.z) * ahead.z;
    }
    order.sort((i, j) => depth[j] - depth[i] || i - j); // far first
    const K = rest.sh.length;
    for (let s = 0; s < N; s++) {
      const i = order[s];
      out.center[3 * s] = P[3 * i];
      out.center[3 * s + 1] = P[3 * i + 1];
      out.center[3 * s + 2] = P[3 * i + 2];
      // Σ = R·diag(σ²)·Rᵀ, R from the unit quaternion (x, y, z, w)
      const x = Q[4 * i],
        y = Q[4 * i + 1],
        z = Q[4 * i + 2],
        w = Q[4 * i + 3];
      const R = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
      ];
      const s2 = [0, 1, 2].map((k) => (rest.scale[3 * i + k] * pose.factor[i]) ** 2);
      const cov = (r, c) =>
        R[r][0] * s2[0] * R[c][0] + R[r][1] * s2[1] * R[c][1] + R[r][2] * s2[2] * R[c][2];
      out.covA[3 * s] = cov(0, 0);
      out.covA[3 * s + 1] = cov(0, 1);
      out.covA[3 * s + 2] = cov(0, 2);
      out.covB[3 * s] = cov(1, 1);
      out.covB[3 * s + 1] = cov(1, 2);
      out.covB[3 * s + 2] = cov(2, 2);
      let dx = P[3 * i] - eye.x,
        dy = P[3 * i + 1] - eye.y,
        dz = P[3 * i + 2] - eye.z;
      const n = Math.hypot(dx, dy, dz) || 1;
      shBasis(dx / n, dy / n, dz / n, K, basis);
      for (let c = 0; c < 3; c++) {
        let v = 0.5;
        for (let k = 0; k < K; k++) v += basis[k] * rest.sh[k][3 * i + c];
        out.rgba[4 * s + c] = Math.max(v, 0); // gsplat clamps at 0 only
      }
      out.rgba[4 * s + 3] = rest.opacity[i];
    }
    for (const name of ["center", "covA", "covB", "rgba"]) {
      geometry.getAttribute(name).needsUpdate = true;
    }
    const size = renderer.getDrawingBufferSize(new Vector2());
    const fy = size.y / (2 * Math.tan((camera.fov * Math.PI) / 360));
    material.uniforms.focal.value.set(fy, fy);
    material.uniforms.viewport.value.copy(size);
  };
  return { mesh, update, bounds, count: N };
}
