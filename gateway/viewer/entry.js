// The viewer page uses noVNC's RFB class from this bundle.
import RFB from "@novnc/novnc";
window.RFB = RFB;
