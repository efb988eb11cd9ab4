/** Types of docs-layers.mjs (a plain module, so `node` runs it as the lint config it reads is run). */
export declare const PROTOCOL_DOC: string;
export declare const ARCHITECTURE_DOC: string;
export declare const LAYER_DOCS: readonly string[];
export declare const BEGIN: string;
export declare const END: string;
export declare function renderLayers(layers?: ReadonlyArray<Record<string, string>>): string;
export declare function regenerate(doc: string, path?: string): string;
